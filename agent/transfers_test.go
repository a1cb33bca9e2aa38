package agent

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kvgate/kvgate/agent/netobs"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// TestTransfersObserved: each NIXL READ of a pull reaches the network
// tracker as a transfer from the peer agent, with its bytes.
func TestTransfersObserved(t *testing.T) {
	tr, err := netobs.New(netobs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := newNode(t, "p", 0)
	d := newNodeWith(t, Config{Name: "d", PullTimeout: 10 * time.Second, Transfers: tr})
	p.region(t, "P", blockBytes, 8, "")
	d.region(t, "D", blockBytes, 8, "")
	ctx := t.Context()
	for i, hashes := range [][]uint64{{1, 2}, {3, 4, 5}} {
		st, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: hashes,
			Hold: &agentv1.Hold{RequestId: "r" + string(rune('0'+i)), LeaseMs: 60000}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: hashes,
			Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "P",
				RemoteRequestId: "r" + string(rune('0'+i)), RemoteBlockIds: st.Slots, TpSize: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	ps := tr.Peers()
	if len(ps) != 1 {
		t.Fatalf("peers %+v", ps)
	}
	got := ps[0]
	if got.Peer != netip.MustParseAddr("127.0.0.1") || got.Class != netobs.NIXLClass || got.Transfers != 2 ||
		got.BytesAcked != 5*blockBytes || got.TransferLatency <= 0 || got.ThroughputBytesPerSec <= 0 {
		t.Fatalf("%+v", got)
	}
}
