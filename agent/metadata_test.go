package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kvgate/kvgate/internal/testutil"
	nixl "github.com/kvgate/kvgate/nixl-cgo"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// TestMetadataCoversRegions: GetMetadata took the NIXL metadata before
// the region list, so a handshake racing a registration could name a
// region whose memory the metadata lacked; the peer kept that handshake
// (the region was known) and every READ of the region failed. Each answer's
// metadata now covers every region it lists.
func TestMetadataCoversRegions(t *testing.T) {
	n := newNode(t, "n", 0)
	checker, err := nixl.NewAgent("checker", nixl.AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer checker.Close()
	if _, err := checker.CreateBackend("UCX", nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range maxRegions {
			if _, err := n.a.RegisterRegion(t.Context(), &agentv1.RegisterRegionRequest{EngineId: fmt.Sprint("E-", i),
				Path: fmt.Sprint(n.dir, "/E-", i), BlockBytes: blockBytes, Slots: 4}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer wg.Wait()
	for seen := 0; seen < maxRegions; {
		md, err := n.a.GetMetadata(t.Context(), &agentv1.GetMetadataRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := checker.LoadRemoteMD(md.NixlMetadata); err != nil {
			t.Fatal(err)
		}
		for _, r := range md.Regions {
			d := nixl.DescList{Type: nixl.DRAM, Descs: []nixl.Desc{{Addr: uintptr(r.BaseAddr), Len: uint64(r.Slots) * md.BlockBytes}}}
			if _, err := checker.PrepXferDlist(md.AgentName, d); err != nil {
				t.Fatalf("handshake with %d regions: region %s is not in its NIXL metadata: %v", len(md.Regions), r.EngineId, err)
			}
		}
		seen = len(md.Regions)
	}
}

// TestWatchesBounded: every WatchReleases call added a watch (and its
// queue of watchQueue releases) to the engine's set without a bound, so a
// caller could grow the agent's memory by opening streams. Past
// maxWatchers an engine's next watch is refused; an ended one frees room.
func TestWatchesBounded(t *testing.T) {
	n := newNode(t, "n", 0)
	n.region(t, "E", blockBytes, 4, "")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for i := range maxWatchers {
		if _, err := n.client.WatchReleases(ctx, &agentv1.WatchReleasesRequest{EngineId: "E"}); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	testutil.WaitFor(t, "the watches to be counted", func() bool {
		n.a.mu.Lock()
		defer n.a.mu.Unlock()
		return len(n.a.watchers["E"]) == maxWatchers
	})
	w, err := n.client.WatchReleases(t.Context(), &agentv1.WatchReleasesRequest{EngineId: "E"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("watch past the bound: %v, want %s", err, codes.ResourceExhausted)
	}
	cancel()
	testutil.WaitFor(t, "the ended watches to be dropped", func() bool {
		n.a.mu.Lock()
		defer n.a.mu.Unlock()
		return len(n.a.watchers["E"]) == 0
	})
}
