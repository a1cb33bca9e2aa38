package telemetry

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// fleetStore fills a store as nodes agents would: each node with 8 GPUs
// (one endpoint each) and measurements of peers other nodes.
func fleetStore(b testing.TB, nodes, peers int) *Store {
	s, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UnixNano()
	ip := func(n int) string { return fmt.Sprintf("10.%d.%d.1", n>>8, n&255) }
	for n := range nodes {
		r := &telemetryv1.Report{Node: fmt.Sprint("node-", n), Addresses: []string{ip(n)}, UnixNano: now}
		for g := range 8 {
			r.Gpus = append(r.Gpus, &telemetryv1.GPU{Index: uint32(g), Endpoints: []string{fmt.Sprintf("%s:%d", ip(n), 8000+g)}})
		}
		for p := 1; p <= peers; p++ {
			r.Peers = append(r.Peers, &telemetryv1.Peer{Address: ip((n + p) % nodes), Class: "kv_nixl", SrttUs: 900,
				ThroughputBytesPerSec: 20e9, UpdatedUnixNano: now})
		}
		s.apply(fmt.Sprint("agent-", n), r)
	}
	return s
}

// BenchmarkPathBetween is the P/D decider's question: one endpoint pair,
// on a 1,024-node fleet whose agents each measured 64 peers.
func BenchmarkPathBetween(b *testing.B) {
	s := fleetStore(b, 1024, 64)
	b.ReportAllocs()
	var ok int
	i := 0
	for b.Loop() {
		// The decoder on node i+1 measured node i (its peer at distance 1 ... 64).
		from := fmt.Sprintf("10.%d.%d.1:8000", (i%1024)>>8, (i%1024)&255)
		n := (i + 1) % 1024
		to := fmt.Sprintf("10.%d.%d.1:8003", n>>8, n&255)
		if _, _, found := s.PathBetween(from, to); found {
			ok++
		}
		i++
	}
	if ok != b.N {
		b.Fatalf("%d of %d pairs found", ok, b.N)
	}
}

// BenchmarkGPUHealth is the gpu-health plugins' question per candidate.
func BenchmarkGPUHealth(b *testing.B) {
	s := fleetStore(b, 1024, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		n := i % 1024
		if _, ok := s.GPUHealth(fmt.Sprintf("10.%d.%d.1:%d", n>>8, n&255, 8000+i%8)); !ok {
			b.Fatal("no health")
		}
		i++
	}
}

// BenchmarkApplyReport is one agent's report arriving (1 s apart per agent
// by default): its indexes replaced under the write lock.
func BenchmarkApplyReport(b *testing.B) {
	s := fleetStore(b, 1024, 64)
	r := s.nodes["node-7"].report
	b.ReportAllocs()
	for b.Loop() {
		s.apply("agent-7", r)
	}
}

// The picker's lookups, asked per candidate, allocate nothing once an
// address has been seen, and PathBetween agrees with PathStats.
func TestLookupsAllocateNothing(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	s := fleetStore(t, 16, 4)
	from, to, gpu := "10.0.1.1:8000", "10.0.0.1:8003", "10.0.3.1:8002"
	bw, rtt, ok := s.PathBetween(from, to)
	p, found := s.PathStats(from, to)
	if !ok || !found || bw != p.ThroughputBytesPerSec || rtt != p.RTT || p.ToNode == "" || len(p.Classes) == 0 {
		t.Fatalf("PathBetween = %v, %v, %v; PathStats = %+v, %v", bw, rtt, ok, p, found)
	}
	if _, ok := s.GPUHealth(gpu); !ok {
		t.Fatal("no GPU health")
	}
	allocs := testing.AllocsPerRun(100, func() {
		_, _, _ = s.PathBetween(from, to)
		_, _ = s.GPUHealth(gpu)
		_, _ = s.NodeOf(from)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per lookup, want 0", allocs)
	}
}
