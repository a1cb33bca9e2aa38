package epp

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// llm-d's data layer reaches the scraper: a core-metrics-extractor engine
// table with custom metric names is how the picker reads the servers'
// pages, so routing follows the custom queue gauge (the servers publish no
// vLLM names at all).
func TestDataLayerEngineConfig(t *testing.T) {
	const cfg = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: metrics-data-source
  parameters: {scheme: http, path: /stats}
- type: core-metrics-extractor
  parameters:
    defaultEngine: my-engine
    engineConfigs:
    - name: my-engine
      queuedRequestsSpec: "engine_queue{state=waiting}"
      runningRequestsSpec: engine_running
      kvUsageSpec: engine_kv
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
`
	page := func(waiting int) string {
		return fmt.Sprintf("engine_queue{state=\"waiting\"} %d\nengine_queue{state=\"done\"} 0\nengine_running 1\nengine_kv 0.5\n", waiting)
	}
	f := startFleet(t, cfg, page(9), page(0), page(4))
	testutil.WaitFor(t, "custom metrics scraped", func() bool {
		m := f.picker.Datastore().ByAddress(f.servers[0].addr)
		return m != nil && m.Metrics().WaitingQueueSize == 9
	})
	f.servers[0].mu.Lock()
	path := f.servers[0].path
	f.servers[0].mu.Unlock()
	if path != "/stats" {
		t.Fatalf("scraped %q, want the data source's /stats", path)
	}
	for range 3 {
		_, r := f.route(t, nil, completion, 1)
		if got := f.destination(t, r); got != f.servers[1].addr {
			t.Fatalf("routed to %s, want %s (custom queue 0)", got, f.servers[1].addr)
		}
	}
}
