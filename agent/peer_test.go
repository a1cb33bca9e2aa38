package agent

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kvgate/kvgate/agent/kvblock"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// overPinner is a peer agent whose PinBlocks answers with more slots than
// it was asked for, or with slots outside its CPU tier.
type overPinner struct {
	*Agent
	slots []uint32
}

func (o overPinner) PinBlocks(ctx context.Context, req *agentv1.PinBlocksRequest) (*agentv1.PinBlocksResponse, error) {
	resp, err := o.Agent.PinBlocks(ctx, req)
	if err != nil {
		return nil, err
	}
	resp.Slots = o.slots
	return resp, nil
}

// TestPullRefusesBadPins: a peer's answer is input like any other. Before,
// more slots than hashes sliced req.Hashes out of range (the panic took the
// whole agent down), and a slot past the CPU tier READ whatever the peer had
// registered there, stored under the hash asked for.
func TestPullRefusesBadPins(t *testing.T) {
	d := newNode(t, "d", 0)
	d.region(t, "D", blockBytes, 4, "")
	src := newNode(t, "src", 4*blockBytes)
	src.region(t, "S", blockBytes, 4, "")
	md, err := src.client.GetMetadata(t.Context(), &agentv1.GetMetadataRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The slot whose address, counted from the CPU tier's base, falls in
	// the engine region S: registered too, so a READ of it would succeed
	// and land the server's bytes under the hash asked for.
	cpu, eng := md.CpuTier.BaseAddr, md.Regions[0].BaseAddr
	if eng < cpu {
		t.Skipf("the engine region lies below the CPU tier (%#x < %#x)", eng, cpu)
	}
	intoEngine := uint32((eng - cpu + blockBytes - 1) / blockBytes)
	for _, tc := range []struct {
		name  string
		slots []uint32
	}{
		{"more slots than hashes", []uint32{0, 1}},
		{"slot outside the CPU tier", []uint32{intoEngine}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveKV(t, overPinner{Agent: src.a, slots: tc.slots})
			_, err = d.a.PullBlocks(t.Context(), &agentv1.PullBlocksRequest{EngineId: "D", Peer: addr,
				Hashes: []uint64{7}, Source: &agentv1.PullBlocksRequest_Cpu{Cpu: &agentv1.CPUSource{}}})
			if codeOf(err) != codes.Unavailable {
				t.Fatalf("got %v, want %s", err, codes.Unavailable)
			}
		})
	}
}

// TestPullThatCannotPinForgetsItsSlots: a pull that runs out of slots part
// way gives back the ones it took. A slot it took fresh was never written,
// so it must not stay mapped to its hash (StoreBlocks already drops such
// slots); before, it was only unpinned, and the region then claimed to
// hold that block (StoreBlocks answered fresh=false over garbage).
func TestPullThatCannotPinForgetsItsSlots(t *testing.T) {
	p, d := newNode(t, "p", 0), newNode(t, "d", 0)
	p.region(t, "P", blockBytes, 4, "")
	d.region(t, "D", blockBytes, 2, "")
	ctx := t.Context()
	// One of D's two slots is held, so a pull of two blocks pins one and
	// fails on the second.
	if _, err := d.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "D", Hashes: []uint64{50},
		Hold: &agentv1.Hold{RequestId: "held", LeaseMs: 60000}}); err != nil {
		t.Fatal(err)
	}
	_, err := d.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: []uint64{1, 2},
		Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "P", RemoteRequestId: "x",
			RemoteBlockIds: []uint32{0, 1}}}})
	if codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("pull: %v, want %s", err, codes.ResourceExhausted)
	}
	st, err := d.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "D", Hashes: []uint64{1}})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Fresh[0] {
		t.Fatal("block 1 was never written, yet the region says it holds it")
	}
}

// misnamed is a peer agent whose handshake names another agent than its
// NIXL metadata does.
type misnamed struct{ *Agent }

func (m misnamed) GetMetadata(ctx context.Context, req *agentv1.GetMetadataRequest) (*agentv1.GetMetadataResponse, error) {
	resp, err := m.Agent.GetMetadata(ctx, req)
	if err == nil {
		resp.AgentName = "someone-else"
	}
	return resp, err
}

// TestRefusedHandshakeLoadsNothing: a handshake whose NIXL metadata names
// another agent than the peer claims to be is refused before the metadata
// is loaded. Before, it was loaded first and stayed (its connection
// included) after the refusal, and loading replaces what is loaded under
// that name: a genuine peer's metadata, while idle, under the pulls the
// agent then sent to it.
func TestRefusedHandshakeLoadsNothing(t *testing.T) {
	d := newNode(t, "d", 0)
	d.region(t, "D", blockBytes, 4, "")
	src := newNode(t, "src", 0)
	src.region(t, "S", blockBytes, 4, "")
	_, err := d.a.PullBlocks(t.Context(), &agentv1.PullBlocksRequest{EngineId: "D", Peer: serveKV(t, misnamed{src.a}), Hashes: []uint64{1},
		Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "S", RemoteRequestId: "x", RemoteBlockIds: []uint32{0}}}})
	if codeOf(err) != codes.FailedPrecondition {
		t.Fatalf("pull: %v, want %s", err, codes.FailedPrecondition)
	}
	if loaded := d.a.nx.RemoteAgents(); len(loaded) != 0 {
		t.Fatalf("metadata still loaded for %q", loaded)
	}
}

// TestPeerChurn: peers come and go (prefill pods rescheduled onto new
// addresses), and a peer is forgotten only when a transfer with it fails,
// which a peer that is simply gone never gives a chance to. Before, the
// maxPeers-th address ever pulled from filled the table for good: every
// pull from a new peer was refused (ResourceExhausted) until the agent
// restarted. The least recently used peer now makes room.
func TestPeerChurn(t *testing.T) {
	d := newNode(t, "d", 0)
	dmem := d.region(t, "D", blockBytes, 4, "")
	p := newNode(t, "p", 0)
	pmem := p.region(t, "P", blockBytes, 4, "")
	ctx := t.Context()
	// Each listener is one more address of the same peer agent: to d, a
	// peer it never saw.
	for i := range maxPeers + 8 {
		if _, err := d.a.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: serveKV(t, p.a), Hashes: []uint64{1},
			Source: &agentv1.PullBlocksRequest_Cpu{Cpu: &agentv1.CPUSource{}}}); err != nil {
			t.Fatalf("pull from the %dth peer address: %v", i+1, err)
		}
	}
	d.a.mu.Lock()
	n := len(d.a.peers)
	d.a.mu.Unlock()
	if n > maxPeers {
		t.Fatalf("%d peers kept, bound %d", n, maxPeers)
	}
	// A transfer still works with the peer known under its first, long
	// evicted, address.
	st, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: []uint64{9},
		Hold: &agentv1.Hold{RequestId: "churn", LeaseMs: 60000}})
	if err != nil {
		t.Fatal(err)
	}
	kvblock.Fill(slot(pmem, st.Slots[0]), 9)
	pull, err := d.a.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: []uint64{9},
		Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "P",
			RemoteRequestId: "churn", RemoteBlockIds: st.Slots, TpSize: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if at := kvblock.Check(slot(dmem, pull.Slots[0]), 9); at >= 0 {
		t.Fatalf("pulled block differs at byte %d", at)
	}
}
