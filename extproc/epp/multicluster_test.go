package epp

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics/peertest"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// A cluster-scoped picker (llm-d's multi-cluster example): peer clusters
// by DNS name, each cluster picker's pool averages read over verified
// https from its metricsAddress/metricsPort; the picker routes to the less
// loaded cluster's gateway by name, and it is not held back waiting for
// pod metrics the clusters do not have.
func TestMultiClusterPicker(t *testing.T) {
	file, ca := peertest.Start(t, "", peertest.Peer{Name: "cluster-a", KV: 0.8, Queue: 9}, peertest.Peer{Name: "cluster-b", KV: 0.1})
	o := DefaultOptions()
	o.ConfigText = `apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- {type: multicluster-file-discovery, name: discovery, parameters: {path: ` + file + `}}
- {type: multicluster-metrics-data-source, name: metrics-source, parameters: {scheme: https, caCertPath: ` + ca + `}}
- {type: multicluster-metrics-extractor, name: metrics-extractor}
- {type: multicluster-session-affinity-filter, name: session-affinity}
- {type: multicluster-kv-cache-utilization-scorer, name: kv-cache}
- {type: multicluster-queue-scorer, name: queue}
- type: max-score-picker
- type: single-profile-handler
dataLayer:
  discovery: {pluginRef: discovery}
  sources:
  - pluginRef: metrics-source
    extractors: [{pluginRef: metrics-extractor}]
`
	o.GRPCAddr, o.HealthAddr, o.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.RefreshMetricsInterval = 10 * time.Millisecond
	p := runPicker(t, o)
	grpcAddr, _, _ := p.Addrs()
	f := &fleet{client: envoytest.Dial(t, grpcAddr), picker: p}
	testutil.WaitFor(t, "both clusters are candidates", func() bool { return len(p.Datastore().Candidates()) == 2 })
	// Until the clusters' metrics are read the choice is a tie; then the
	// less loaded cluster wins every time.
	want := peertest.Gateway("cluster-b")
	deadline := time.Now().Add(10 * time.Second)
	for streak := 0; streak < 30; { // 30 in a row: not a run of ties
		_, r := f.route(t, nil, completion, 1)
		got := f.destination(t, r)
		if got != want {
			streak = 0
			if time.Now().After(deadline) {
				t.Fatalf("routed to %s, want the less loaded %s", got, want)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		streak++
	}
}
