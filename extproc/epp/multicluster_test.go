package epp

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// A cluster-scoped picker (llm-d's multi-cluster example): peer clusters
// by DNS name, each cluster picker's pool averages read over verified
// https from its metricsAddress/metricsPort; the picker routes to the less
// loaded cluster's gateway by name, and it is not held back waiting for
// pod metrics the clusters do not have.
func TestMultiClusterPicker(t *testing.T) {
	cert, _ := testutil.SelfSignedCert(t)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	var clusters strings.Builder
	clusters.WriteString("endpoints:\n")
	for _, c := range []struct {
		name      string
		kv, queue float64
	}{{"cluster-a", 0.8, 9}, {"cluster-b", 0.1, 0}} {
		page := fmt.Sprintf("llm_d_epp_average_kv_cache_utilization{name=\"pool\"} %v\nllm_d_epp_average_queue_size{name=\"pool\"} %v\n", c.kv, c.queue)
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(page)) }))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		fmt.Fprintf(&clusters, "- name: %s\n  address: gateway.%s.example.com\n  port: 443\n  labels: {metricsAddress: %q, metricsPort: %q}\n", c.name, c.name, host, port)
	}
	file := filepath.Join(dir, "clusters.yaml")
	if err := os.WriteFile(file, []byte(clusters.String()), 0o600); err != nil {
		t.Fatal(err)
	}
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
	waitFor(t, "both clusters are candidates", func() bool { return len(p.Datastore().Candidates()) == 2 })
	// Until the clusters' metrics are read the choice is a tie; then the
	// less loaded cluster wins every time.
	const want = "gateway.cluster-b.example.com:443"
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
