package telemetry_test

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	agenttel "github.com/kvgate/kvgate/agent/telemetry"
	"github.com/kvgate/kvgate/agent/telemetry/telemetrytest"
	"github.com/kvgate/kvgate/extproc/telemetry"
	"github.com/kvgate/kvgate/internal/testutil"
)

// agent is a real telemetry server on loopback.
type agent struct {
	addr string
	stop func()
}

func startAgent(t *testing.T, cfg agenttel.Config) *agent {
	t.Helper()
	addr, stop := telemetrytest.Serve(t, cfg)
	return &agent{addr: addr, stop: stop}
}

// static is a fixed peer source (agent/netobs's tracker, as the agent
// adapts it, is tested there and in agent/e2e).
type static []agenttel.PeerStats

func (s static) Peers() []agenttel.PeerStats { return s }

// nixlRead is what the agent reports after one NIXL READ of n bytes from
// peer that took d.
func nixlRead(peer string, n uint64, d time.Duration) static {
	return static{{Peer: netip.MustParseAddr(peer), Class: "kv_nixl", SRTT: d, BytesAcked: n,
		ThroughputBytesPerSec: float64(n) / d.Seconds(), Updated: time.Now()}}
}

// gpus is a fixed GPU source (the agent's NVML collector is tested in
// agent/gpu; here the routing side is under test).
type gpus struct {
	mu sync.Mutex
	gs []agenttel.GPU
}

func (g *gpus) GPUs() []agenttel.GPU {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]agenttel.GPU(nil), g.gs...)
}
func (g *gpus) Available() (bool, string) { return true, "" }

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func run(t *testing.T, cfg telemetry.Config) *telemetry.Store {
	t.Helper()
	s, err := telemetry.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

func TestMatrixAndHealth(t *testing.T) {
	// Node a's agent has timed READs from node b's agent (P/D: a decodes,
	// b prefills); node b has measured nothing.
	tr := nixlRead("10.0.0.2", 64<<20, 10*time.Millisecond)
	ga := &gpus{gs: []agenttel.GPU{
		{Index: 0, Endpoints: []string{"10.0.0.1:8000"}, TemperatureCelsius: 60},
		{Index: 1, Endpoints: []string{"10.0.0.1:8001"}, XIDErrors: 1, LastXID: 79, LastXIDTime: time.Now()},
	}}
	a := startAgent(t, agenttel.Config{Node: "a", Addresses: addrs("10.0.0.1"), GPUs: ga, Peers: []agenttel.PeerSource{tr}})
	b := startAgent(t, agenttel.Config{Node: "b", Addresses: addrs("10.0.0.2")})
	s := run(t, telemetry.Config{Agents: []string{a.addr, b.addr}, Interval: 100 * time.Millisecond, StaleAfter: time.Second})
	testutil.WaitFor(t, "both nodes", func() bool { return len(s.Nodes()) == 2 })

	for _, tc := range []struct {
		name, from, to string
		ok             bool
	}{
		{"prefiller to decoder", "10.0.0.2:8000", "10.0.0.1:8000", true},
		{"decoder to prefiller (the same path, measured by a)", "10.0.0.1:8001", "10.0.0.2:9000", true},
		{"one node", "10.0.0.1:8000", "10.0.0.1:8001", false},
		{"unknown host", "10.0.0.1:8000", "10.9.9.9:8000", false},
		{"not an address", "10.0.0.1:8000", "vllm-0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bps, rtt, ok := s.PathBetween(tc.from, tc.to)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if want := float64(64<<20) / 0.01; bps < want*0.99 || bps > want*1.01 {
				t.Errorf("throughput %v, want %v", bps, want)
			}
			if rtt != 10*time.Millisecond {
				t.Errorf("rtt %v", rtt)
			}
		})
	}
	if n, ok := s.NodeOf("10.0.0.2:8000"); !ok || n != "b" {
		t.Errorf("NodeOf = %q %v", n, ok)
	}
	m := s.Matrix()
	if len(m) != 1 || m[0].FromNode != "a" || m[0].ToNode != "b" || m[0].Classes[0] != "kv_nixl" {
		t.Errorf("matrix %+v", m)
	}

	h, ok := s.GPUHealth("10.0.0.1:8001")
	if !ok || h.Node != "a" || h.GPUs != 1 || h.XIDErrors != 1 || h.LastXID != 79 {
		t.Errorf("health of the XID GPU: %+v %v", h, ok)
	}
	if h, ok := s.GPUHealth("10.0.0.1:8000"); !ok || h.XIDErrors != 0 || h.MaxTemperatureCelsius != 60 {
		t.Errorf("health of the good GPU: %+v %v", h, ok)
	}
	if _, ok := s.GPUHealth("10.0.0.2:8000"); ok {
		t.Error("health for a node without GPUs")
	}

	// Node b's agent goes away: its report ages out, a's measurement of b's
	// address stays (it is a's, and fresh).
	b.stop()
	testutil.WaitFor(t, "b to age out", func() bool { return len(s.Nodes()) == 1 })
	if _, ok := s.NodeOf("10.0.0.2:8000"); ok {
		t.Error("b still resolves after its agent died")
	}
	if _, _, ok := s.PathBetween("10.0.0.2:8000", "10.0.0.1:8000"); !ok {
		t.Error("a's own measurement of b was dropped with b")
	}
}

// retrans is a TCP-like peer source (the eBPF tracker's shape) whose
// retransmit counter grows by 10 per report.
type retrans struct {
	mu sync.Mutex
	n  uint64
}

func (r *retrans) Peers() []agenttel.PeerStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n += 10
	return []agenttel.PeerStats{{Peer: netip.MustParseAddr("10.0.0.2"), Class: "kv-tcp", Flows: 3, SRTT: 2 * time.Millisecond,
		MinRTT: time.Millisecond, Retransmits: r.n, BytesAcked: 1 << 30, ThroughputBytesPerSec: 1e9, Updated: time.Now()}}
}

func TestRetransmitRateAndClasses(t *testing.T) {
	tr := nixlRead("10.0.0.2", 1<<30, 100*time.Millisecond) // 10.7 GB/s over RDMA, 100 ms
	a := startAgent(t, agenttel.Config{Node: "a", Addresses: addrs("10.0.0.1"), Peers: []agenttel.PeerSource{&retrans{}, tr}})
	s := run(t, telemetry.Config{Agents: []string{a.addr}, Interval: 100 * time.Millisecond})
	var p telemetry.Path
	testutil.WaitFor(t, "a retransmit rate", func() bool {
		var ok bool
		p, ok = s.PathStats("10.0.0.1:1", "10.0.0.2:1")
		return ok && p.RetransmitsPerSec > 0
	})
	// Two classes merge: the best throughput (NIXL's), the smallest RTT (TCP's).
	if p.ThroughputBytesPerSec < 1e10 || p.RTT != 2*time.Millisecond || p.MinRTT != time.Millisecond || len(p.Classes) != 2 {
		t.Errorf("path %+v", p)
	}
}

// A dead agent (a port that accepts and never answers) and a closed port
// do not keep the live agent's telemetry from the queries.
func TestDeadAgentsDoNotBlock(t *testing.T) {
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hang.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := hang.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	closedAddr := testutil.RefusedAddr(t)
	live := startAgent(t, agenttel.Config{Node: "live", Addresses: addrs("10.0.0.1"),
		GPUs: &gpus{gs: []agenttel.GPU{{Endpoints: []string{"10.0.0.1:8000"}}}}})
	s := run(t, telemetry.Config{Agents: []string{hang.Addr().String(), closedAddr, live.addr}, Interval: 100 * time.Millisecond})
	testutil.WaitFor(t, "the live agent", func() bool { _, ok := s.GPUHealth("10.0.0.1:8000"); return ok })
	if got := s.Nodes(); len(got) != 1 || got[0] != "live" {
		t.Fatalf("nodes %v", got)
	}
	testutil.WaitFor(t, "the closed port's failure counted", func() bool { return metricValue(t, s, "kvgate_telemetry_stream_failures_total") > 0 })
	for name, want := range map[string]float64{"kvgate_telemetry_agents": 3, "kvgate_telemetry_agents_streaming": 1, "kvgate_telemetry_nodes": 1} {
		if got := metricValue(t, s, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if metricValue(t, s, "kvgate_telemetry_reports_total") < 1 {
		t.Error("no report counted")
	}
}

func metricValue(t *testing.T, s *telemetry.Store, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.Metric[0]
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

func TestSetAgents(t *testing.T) {
	a := startAgent(t, agenttel.Config{Node: "a", Addresses: addrs("10.0.0.1")})
	b := startAgent(t, agenttel.Config{Node: "b", Addresses: addrs("10.0.0.2")})
	s := run(t, telemetry.Config{Agents: []string{a.addr}, Interval: 100 * time.Millisecond, StaleAfter: time.Minute})
	s.SetAgents([]string{b.addr})
	testutil.WaitFor(t, "a and b", func() bool { return len(s.Nodes()) == 2 })
	// b leaves the DaemonSet: it is dropped at once, not after a minute.
	s.SetAgents(nil)
	testutil.WaitFor(t, "b dropped", func() bool { return len(s.Nodes()) == 1 })
	if n, _ := s.NodeOf("10.0.0.1:1"); n != "a" {
		t.Errorf("static agent lost: %q", n)
	}
}

// Run's return ends every subscription goroutine and its connection.
func TestRunStopsEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	addr, stop := telemetrytest.Serve(t, agenttel.Config{Node: "a"})
	s, err := telemetry.New(telemetry.Config{Agents: []string{addr, "127.0.0.1:1"}, Interval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	testutil.WaitFor(t, "a", func() bool { return len(s.Nodes()) == 1 })
	cancel()
	<-done
	stop()
	testutil.NoGoroutineLeak(t, before, "Run returned and the agent stopped")
}

func TestConfigErrors(t *testing.T) {
	if _, err := telemetry.New(telemetry.Config{Agents: []string{"no-port"}}); err == nil {
		t.Error("an agent without a port accepted")
	}
	if _, err := telemetry.New(telemetry.Config{Agents: []string{"a:1", "b:1"}, MaxAgents: 1}); err == nil {
		t.Error("more agents than MaxAgents accepted")
	}
}
