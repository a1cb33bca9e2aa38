package epp

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// dcgmExporters serves a DCGM exporter page on the same port of each
// host, as a sidecar beside each model server; util[i] is host i's GPU
// utilization in percent, labelled with pod-i.
func dcgmExporters(t *testing.T, util []*atomic.Int64) int {
	t.Helper()
	for range 20 {
		var ls []net.Listener
		port := 0
		for i := range util {
			l, err := net.Listen("tcp", net.JoinHostPort(fmt.Sprintf("127.0.0.%d", i+2), strconv.Itoa(port)))
			if err != nil {
				break
			}
			ls = append(ls, l)
			port = l.Addr().(*net.TCPAddr).Port
		}
		if len(ls) < len(util) {
			for _, l := range ls {
				_ = l.Close()
			}
			continue // the port was taken on another host: try another
		}
		for i, l := range ls {
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",pod=\"pod-%d\"} %d\n", i, util[i].Load())
			})}
			go func() { _ = srv.Serve(l) }()
			t.Cleanup(func() { _ = srv.Close() })
		}
		return port
	}
	t.Fatal("no port free on every host")
	return 0
}

// The real picker runs llm-d's DCGM data layer: it polls the exporter
// beside each server, and endpoint-attribute-filter / -scorer route away
// from busy GPUs, following the utilization as it changes.
func TestDCGMGPUUtilizationRouting(t *testing.T) {
	util := []*atomic.Int64{{}, {}, {}}
	util[0].Store(95) // over the filter's 0.9
	util[1].Store(20)
	util[2].Store(60)
	port := dcgmExporters(t, util)
	cfg := fmt.Sprintf(`apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: dcgm-data-source
  name: dcgm-source
  parameters: {port: %d, interval: 10ms}
- type: dcgm-extractor
- type: endpoint-attribute-filter
  name: gpu-utilization-filter
  parameters:
    attribute: GPUUtilization
    producer: dcgm-extractor
    onMissing: Pass
    fallbackOnEmpty: true
    algorithm: {type: threshold, threshold: {operator: LessThanOrEqual, value: 0.9}}
- type: endpoint-attribute-scorer
  name: gpu-utilization-scorer
  parameters:
    attributeKey: GPUUtilization
    producer: dcgm-extractor
    algorithm: {type: linear_lower_is_better, normalization: {fixedRange: {min: 0.0, max: 1.0}}}
- type: queue-scorer
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: dcgm-source
    extractors:
    - pluginRef: dcgm-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: gpu-utilization-filter
  - pluginRef: gpu-utilization-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
`, port)
	// pod-0 has the shortest queue: only the GPU data keeps it out.
	f := startFleet(t, cfg, vllmMetrics(0, 0.1, ""), vllmMetrics(2, 0.1, ""), vllmMetrics(2, 0.1, ""))
	routed := func() string {
		_, r := f.route(t, nil, completion, 1)
		return f.destination(t, r)
	}
	testutil.WaitFor(t, "GPU utilization steering to pod-1", func() bool { return routed() == f.servers[1].addr })
	util[1].Store(99)
	testutil.WaitFor(t, "pod-1's busy GPU steering to pod-2", func() bool { return routed() == f.servers[2].addr })
	for range 3 {
		if got := routed(); got != f.servers[2].addr {
			t.Fatalf("routed to %s, want pod-2 %s", got, f.servers[2].addr)
		}
	}
}
