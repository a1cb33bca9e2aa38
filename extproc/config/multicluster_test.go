package config

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics/peertest"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// multiclusterConfig is llm-d's multi-cluster example (its plugins
// README), with the clusters file and CA bundle of the test.
const multiclusterConfig = `apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: multicluster-file-discovery
  name: discovery
  parameters:
    path: %s
- type: multicluster-metrics-data-source
  name: metrics-source
  parameters:
    scheme: https
    caCertPath: %s
- type: multicluster-metrics-extractor
  name: metrics-extractor
- type: multicluster-session-affinity-filter
  name: session-affinity
- type: multicluster-kv-cache-utilization-scorer
  name: kv-cache
- type: multicluster-queue-scorer
  name: queue
- type: max-score-picker
- type: single-profile-handler
dataLayer:
  discovery:
    pluginRef: discovery
  sources:
  - pluginRef: metrics-source
    extractors:
    - pluginRef: metrics-extractor
`

// TestMultiCluster runs the example against two peer clusters: each is a
// gateway by DNS name, its picker's metrics on a loopback https server
// named by the metricsAddress/metricsPort labels. The less loaded cluster
// is picked; a session token pins the other.
func TestMultiCluster(t *testing.T) {
	path, ca := peertest.Start(t, "peers", peertest.Peer{Name: "cluster-a", KV: 0.9, Queue: 12}, peertest.Peer{Name: "cluster-b", KV: 0.2, Queue: 1})
	c, err := Parse([]byte(fmt.Sprintf(multiclusterConfig, path, ca)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(c, all.Registry(), &scheduling.Handle{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Discovery == nil || len(b.Pollers) != 1 {
		t.Fatalf("discovery %v, pollers %d", b.Discovery, len(b.Pollers))
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ds := endpoints.NewDatastore()
	applied := make(chan struct{}, 1)
	go func() {
		_ = b.Discovery.Run(ctx, func(specs []endpoints.Spec) error {
			err := ds.Replace(specs)
			select {
			case applied <- struct{}{}:
			default:
			}
			return err
		})
	}()
	select {
	case <-applied:
	case <-time.After(10 * time.Second):
		t.Fatal("clusters file not applied")
	}
	go func() { _ = b.Pollers[0].Poll(ctx, ds, 10*time.Millisecond) }()
	var x *multiclustermetrics.Extractor
	for _, p := range b.Plugins {
		if e, ok := p.(*multiclustermetrics.Extractor); ok {
			x = e
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, okA := x.Attribute(multiclustermetrics.QueueSize, ds.Get("cluster-a"))
		_, okB := x.Attribute(multiclustermetrics.KVCacheUtilization, ds.Get("cluster-b"))
		if okA && okB {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the clusters' metrics were not read")
		}
		time.Sleep(5 * time.Millisecond)
	}
	pick := func(headers map[string]string) string {
		t.Helper()
		res, err := b.Scheduler.Schedule(ctx, scheduling.NewCycleState(), &scheduling.Request{ID: "r", Headers: headers}, ds.All())
		if err != nil {
			t.Fatal(err)
		}
		return res.Primary().Targets[0].Address()
	}
	if got := pick(nil); got != peertest.Gateway("cluster-b") {
		t.Fatalf("picked %s, want the less loaded cluster-b", got)
	}
	token := base64.StdEncoding.EncodeToString([]byte("peers/cluster-a"))
	if got := pick(map[string]string{"x-session-token": token}); got != peertest.Gateway("cluster-a") {
		t.Fatalf("with cluster-a's session token picked %s", got)
	}
}

// The multicluster scorers read the extractor: without one the
// configuration is refused, as in llm-d.
func TestMultiClusterScorersNeedExtractor(t *testing.T) {
	for _, typ := range []string{"multicluster-kv-cache-utilization-scorer", "multicluster-queue-scorer"} {
		c, err := Parse([]byte("apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nplugins:\n- type: " + typ + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Build(c, all.Registry(), &scheduling.Handle{}, nil); err == nil || !strings.Contains(err.Error(), "multicluster-metrics-extractor") {
			t.Errorf("%s without an extractor: err = %v", typ, err)
		}
	}
}
