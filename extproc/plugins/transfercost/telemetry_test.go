package transfercost_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	agenttel "github.com/kvgate/kvgate/agent/telemetry"
	"github.com/kvgate/kvgate/agent/telemetry/telemetrytest"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/telemetry"
)

// nixlReads is the decode node's agent's account of its NIXL READs from
// the prefill node; set changes it as new transfers would.
type nixlReads struct {
	mu  sync.Mutex
	bps float64
}

func (r *nixlReads) set(bps float64) { r.mu.Lock(); r.bps = bps; r.mu.Unlock() }

func (r *nixlReads) Peers() []agenttel.PeerStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return []agenttel.PeerStats{{Peer: netip.MustParseAddr("10.0.0.2"), Class: "kv_nixl", Flows: 1,
		SRTT: time.Millisecond, MinRTT: time.Millisecond, BytesAcked: 1 << 30, ThroughputBytesPerSec: r.bps, Updated: time.Now()}}
}

// The network matrix the picker builds from the node agents' telemetry
// streams changes the P/D decision: two real agents over loopback (the
// decoder's node reports its READs from the prefiller's node), the
// picker's telemetry store subscribed to them as the decider's
// NetworkView. While the measured path is fast the busy decode server's
// long prompt is prefilled remotely; once the agent measures the path slow
// it is prefilled locally; fast again, remotely again.
func TestTelemetryMatrixChangesTheDecision(t *testing.T) {
	reads := &nixlReads{bps: 40e9}
	decodeAgent, _ := telemetrytest.Serve(t, agenttel.Config{Node: "decode-node",
		Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Peers: []agenttel.PeerSource{reads}})
	prefillAgent, _ := telemetrytest.Serve(t, agenttel.Config{Node: "prefill-node",
		Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.2")}})
	store, err := telemetry.New(telemetry.Config{Agents: []string{decodeAgent, prefillAgent},
		Interval: 50 * time.Millisecond, StaleAfter: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx) }()
	defer func() { cancel(); <-done }()

	endpoint := func(name, addr, role string) *endpoints.Endpoint {
		e := endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: addr, Labels: map[string]string{endpoints.RoleLabel: role}})
		e.SetMetrics(&endpoints.Metrics{UpdateTime: time.Now()})
		return e
	}
	d, p := endpoint("d", "10.0.0.1:8000", "decode"), endpoint("p", "10.0.0.2:8000", "prefill")
	eps := []*endpoints.Endpoint{d, p}
	// Without telemetry the decider would assume its static default
	// network; a slow default makes sure the remote choice below is the
	// measured path's doing.
	b := build(t, fleetConfig(false, "overhead: 1ms, bandwidthBytesPerSecond: 1e8"), store)
	backlog := d.Charge(0, 60000, 60000, 60000)
	defer backlog.Release()

	waitPath := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second) // a hang guard
		for {
			if bps, _, ok := store.PathBetween(p.Address(), d.Address()); ok && bps == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the store never saw the path at %v B/s", want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, step := range []struct {
		bps  float64
		want string
	}{
		{40e9, p.Address()}, // 8000 × 128 KiB in ~26 ms: remote prefill beats the backlog
		{1e8, ""},           // ~10 s over the path: prefill where the request decodes
		{40e9, p.Address()},
	} {
		reads.set(step.bps)
		waitPath(step.bps)
		if got := decide(t, b, eps, 8000); got != step.want {
			t.Errorf("path measured at %.0e B/s: prefill %q, want %q", step.bps, got, step.want)
		}
	}
}
