package agent

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/agent/kvblock"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// restartable serves the handshake of whichever agent runs now, so that a
// peer's address outlives its agent process.
type restartable struct {
	agentv1.UnimplementedKVTransferServer
	cur atomic.Pointer[Agent]
}

func (r *restartable) GetMetadata(ctx context.Context, req *agentv1.GetMetadataRequest) (*agentv1.GetMetadataResponse, error) {
	return r.cur.Load().GetMetadata(ctx, req)
}

// TestPullAfterPeerRestart: a prefiller's agent restarts (same name, its
// server's region registered again) while a decoder's agent knows it under
// two addresses (a node IP and a DNS name, say). The first pull after the
// restart fails on the dead connection and drops the peer's NIXL metadata;
// a pull under the other address then found no metadata for the name
// (NIXL_ERR_NOT_FOUND) and failed, as every later pull there did, since
// only a disconnect made the agent forget a peer. Now such a pull drops the
// stale peer, handshakes again and reads.
func TestPullAfterPeerRestart(t *testing.T) {
	d := newNode(t, "d", 0)
	dmem := d.region(t, "D", blockBytes, 8, "")
	dir := t.TempDir()
	path := dir + "/P"
	pmem, err := kvblock.Map(path, 8*blockBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer kvblock.Unmap(pmem)
	ctx := t.Context()
	srv := &restartable{}
	start := func() {
		t.Helper()
		a, err := New(Config{Name: "p", RegionDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.RegisterRegion(ctx, &agentv1.RegisterRegionRequest{EngineId: "P", Path: path, BlockBytes: blockBytes, Slots: 8}); err != nil {
			a.Close()
			t.Fatal(err)
		}
		if old := srv.cur.Swap(a); old != nil {
			old.Close()
		}
	}
	start()
	t.Cleanup(func() { srv.cur.Load().Close() })
	addrs := [2]string{serveKV(t, srv), serveKV(t, srv)}
	n := uint64(0)
	pull := func(addr string) error {
		n++
		st, err := srv.cur.Load().StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: []uint64{n},
			Hold: &agentv1.Hold{RequestId: fmt.Sprint("r", n), LeaseMs: 60000}})
		if err != nil {
			t.Fatal(err)
		}
		kvblock.Fill(pmem[int(st.Slots[0])*blockBytes:][:blockBytes], n)
		resp, err := d.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: addr, Hashes: []uint64{n},
			Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "P",
				RemoteRequestId: fmt.Sprint("r", n), RemoteBlockIds: st.Slots, TpSize: 1}}})
		if err != nil {
			return err
		}
		if at := kvblock.Check(slot(dmem, resp.Slots[0]), n); at >= 0 {
			t.Fatalf("block %d differs at byte %d", n, at)
		}
		return nil
	}
	for _, addr := range addrs {
		if err := pull(addr); err != nil {
			t.Fatalf("before the restart, via %s: %v", addr, err)
		}
	}
	start()
	if err := pull(addrs[0]); err == nil {
		t.Fatal("a READ over the dead agent's connection succeeded")
	}
	if loaded := d.a.nx.RemoteAgents(); len(loaded) != 0 {
		t.Fatalf("the failed pull left the dead agent's metadata loaded (%q)", loaded)
	}
	for i, addr := range []string{addrs[1], addrs[1], addrs[0]} {
		if err := pull(addr); err != nil {
			t.Fatalf("pull %d after the restart, via %s: %v", i, addr, err)
		}
	}
}
