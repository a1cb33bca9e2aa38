package epp

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// llm-d's no-Kubernetes deployment: the guide's configuration, its
// file-discovery naming the servers in llm-d's format, watched.
func TestFileDiscovery(t *testing.T) {
	busy := startModelServer(t, "127.0.0.2", vllmMetrics(6, 0.5, ""))
	idle := startModelServer(t, "127.0.0.3", vllmMetrics(0, 0.1, ""))
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	entry := func(name, addr string) string {
		host, port, _ := net.SplitHostPort(addr)
		return fmt.Sprintf("- name: %s\n  address: %q\n  port: %q\n", name, host, port)
	}
	write := func(content string) {
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("endpoints:\n" + entry("vllm-0", busy.addr) + entry("vllm-1", idle.addr))
	cfg := `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: file-discovery
  type: file-discovery
  parameters:
    path: ` + file + `
    watchFile: true
- type: queue-scorer
- type: kv-cache-utilization-scorer
- name: metrics-source
  type: metrics-data-source
- name: metrics-extractor
  type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
dataLayer:
  injectDefaults: false
  discovery:
    pluginRef: file-discovery
  sources:
  - pluginRef: metrics-source
    extractors:
    - pluginRef: metrics-extractor
`
	o := DefaultOptions()
	o.ConfigText = cfg
	o.GRPCAddr, o.HealthAddr, o.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.RefreshMetricsInterval = 10 * time.Millisecond
	p := runPicker(t, o)
	grpcAddr, _, _ := p.Addrs()
	f := &fleet{client: envoytest.Dial(t, grpcAddr), picker: p}
	scraped := func(n int) func() bool {
		return func() bool {
			c := p.Datastore().Candidates()
			return len(c) == n && len(p.Datastore().All()) == n
		}
	}
	testutil.WaitFor(t, "both servers discovered and scraped", scraped(2))
	if a := p.Datastore().Get("vllm-1").Address(); a != idle.addr {
		t.Fatalf("vllm-1 at %s, want %s", a, idle.addr)
	}
	for range 3 {
		if _, r := f.route(t, nil, completion, 1); f.destination(t, r) != idle.addr {
			t.Fatalf("routed to %s, want the idle %s", f.destination(t, r), idle.addr)
		}
	}
	// An edit of the file takes the idle server out.
	write("endpoints:\n" + entry("vllm-0", busy.addr))
	testutil.WaitFor(t, "the edit applied", scraped(1))
	if _, r := f.route(t, nil, completion, 1); f.destination(t, r) != busy.addr {
		t.Fatalf("routed to %s after the edit, want %s", f.destination(t, r), busy.addr)
	}

	// The configuration's discovery and --endpoints are exclusive.
	o.EndpointsFile = file
	if _, err := New(o, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Fatal("--endpoints with dataLayer.discovery accepted")
	}
}
