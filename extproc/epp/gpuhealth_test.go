package epp

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/agent/gpu"
	"github.com/kvgate/kvgate/agent/gpu/gpumock"
	agenttel "github.com/kvgate/kvgate/agent/telemetry"
	"github.com/kvgate/kvgate/agent/telemetry/telemetrytest"
	"github.com/kvgate/kvgate/internal/testutil"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// gpuAgent is the node agent's telemetry side as kvgate-agent assembles
// it: the NVML collector, here over go-nvml's mock DGX H100, and the
// telemetry service on loopback. Model server i runs on GPU i (its own
// loopback IP, as startFleet places them).
func gpuAgent(t *testing.T, servers int) (*gpumock.Server, string) {
	t.Helper()
	m, err := gpumock.New("dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	eps := map[int][]string{}
	for i := range servers {
		eps[i] = []string{net.IPv4(127, 0, 0, byte(i+2)).String()}
	}
	c, err := gpu.New(gpu.Config{Lib: m, Endpoints: eps, MinSamplePeriod: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	addr, stop := telemetrytest.Serve(t, agenttel.Config{Node: "gpu-node-0", GPUs: c})
	t.Cleanup(func() {
		stop()
		cancel()
		wg.Wait()
		c.Close()
	})
	return m, addr
}

const gpuHealthConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: gpu-health-filter
- type: gpu-health-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: gpu-health-filter
  - pluginRef: gpu-health-scorer
    weight: 1
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
`

// A GPU that raises an XID error stops receiving traffic: the real picker
// subscribed to the agent's telemetry stream routes away from it, though
// its server has the shortest queue.
func TestXIDErrorStopsTraffic(t *testing.T) {
	m, agent := gpuAgent(t, 3)
	f := startFleetWith(t, func(o *Options) {
		o.ConfigText = gpuHealthConfig
		o.Telemetry.Agents, o.Telemetry.Interval = []string{agent}, 100*time.Millisecond
	}, vllmMetrics(0, 0.1, ""), vllmMetrics(4, 0.1, ""), vllmMetrics(8, 0.1, ""))
	testutil.WaitFor(t, "telemetry from the agent", func() bool { return len(f.picker.telemetry.Nodes()) == 1 })
	for range 5 {
		if _, r := f.route(t, nil, completion, 1); f.destination(t, r) != f.servers[0].addr {
			t.Fatalf("healthy fleet: routed to %s, want the idle %s", f.destination(t, r), f.servers[0].addr)
		}
	}
	m.InjectXID(0, 79) // GPU has fallen off the bus
	testutil.WaitFor(t, "traffic to leave the XID GPU", func() bool {
		_, r := f.route(t, nil, completion, 1)
		return f.destination(t, r) != f.servers[0].addr
	})
	for range 20 {
		_, r := f.route(t, nil, completion, 1)
		if got := f.destination(t, r); got != f.servers[1].addr {
			t.Fatalf("after XID 79 on GPU 0: routed to %s, want %s (next shortest queue)", got, f.servers[1].addr)
		}
	}
	// An application-caused XID (13) on GPU 1 does not count.
	m.InjectXID(1, 13)
	testutil.WaitFor(t, "XID 13 to reach the picker", func() bool {
		h, ok := f.picker.telemetry.GPUHealth(f.servers[1].addr)
		return ok && h.LastXID == 13
	})
	if _, r := f.route(t, nil, completion, 1); f.destination(t, r) != f.servers[1].addr {
		t.Fatalf("XID 13 moved traffic to %s", f.destination(t, r))
	}
	// Thermal throttling on GPU 1 too: the filter drops it as well.
	m.Update(1, func(s *gpumock.State) { s.ThrottleReasons = telemetryv1.ThrottleHWThermalSlowdown })
	testutil.WaitFor(t, "traffic to leave the hot GPU", func() bool {
		_, r := f.route(t, nil, completion, 1)
		return f.destination(t, r) == f.servers[2].addr
	})
}

// A picker whose agent is gone keeps routing on what it has: once the
// reports age out, every endpoint counts as healthy again.
func TestDeadAgentDoesNotBlockRouting(t *testing.T) {
	f := startFleetWith(t, func(o *Options) {
		o.ConfigText = gpuHealthConfig
		o.Telemetry.Agents = []string{"127.0.0.1:1"} // nothing listens
	}, vllmMetrics(0, 0.1, ""), vllmMetrics(4, 0.1, ""))
	for range 5 {
		if _, r := f.route(t, nil, completion, 1); f.destination(t, r) != f.servers[0].addr {
			t.Fatalf("routed to %s, want %s", f.destination(t, r), f.servers[0].addr)
		}
	}
}

func TestGPUHealthNeedsTelemetry(t *testing.T) {
	o := DefaultOptions()
	o.EndpointsFile, o.ConfigText = "x.yaml", gpuHealthConfig
	if _, err := New(o, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), "telemetry stream") {
		t.Fatalf("gpu-health plugins without the telemetry stream: %v", err)
	}
}
