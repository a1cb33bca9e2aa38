package agent

import (
	"testing"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// TestCallsAfterClose: Close unmaps the regions and the CPU tier, and a
// call that reaches the agent after it (a handler still running when Main
// returns on a failed Serve, which stops no connection) must not touch
// them. Before, OffloadBlocks and LoadBlocks copied between the unmapped
// ranges (the process faulted), and a second Close unmapped them again,
// whatever had been mapped there since.
func TestCallsAfterClose(t *testing.T) {
	n := newNode(t, "n", 4*blockBytes)
	n.region(t, "E", blockBytes, 4, "")
	ctx := t.Context()
	// Block 1 in the CPU tier only, block 5 in the region only: loading
	// the one and offloading the other copy bytes.
	if _, err := n.a.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "E", Hashes: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.a.OffloadBlocks(ctx, &agentv1.OffloadBlocksRequest{EngineId: "E", Blocks: []*agentv1.OffloadBlock{{Hash: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.a.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "E", Hashes: []uint64{2, 3, 4, 5}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := n.a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"RegisterRegion", func() error {
			_, err := n.a.RegisterRegion(ctx, &agentv1.RegisterRegionRequest{EngineId: "F", Path: n.dir + "/F", BlockBytes: blockBytes, Slots: 4})
			return err
		}},
		{"StoreBlocks", func() error {
			_, err := n.a.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "E", Hashes: []uint64{2}})
			return err
		}},
		{"OffloadBlocks", func() error {
			_, err := n.a.OffloadBlocks(ctx, &agentv1.OffloadBlocksRequest{EngineId: "E", Blocks: []*agentv1.OffloadBlock{{Hash: 5}}})
			return err
		}},
		{"LoadBlocks", func() error {
			_, err := n.a.LoadBlocks(ctx, &agentv1.LoadBlocksRequest{EngineId: "E", Hashes: []uint64{1}})
			return err
		}},
		{"GetMetadata", func() error {
			_, err := n.a.GetMetadata(ctx, &agentv1.GetMetadataRequest{})
			return err
		}},
		{"PullBlocks", func() error {
			_, err := n.a.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "E", Peer: "127.0.0.1:1", Hashes: []uint64{9},
				Source: &agentv1.PullBlocksRequest_Cpu{Cpu: &agentv1.CPUSource{}}})
			return err
		}},
		{"PinBlocks", func() error {
			_, err := n.a.PinBlocks(ctx, &agentv1.PinBlocksRequest{Hashes: []uint64{1}})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); codeOf(err) != codes.Unavailable {
				t.Fatalf("after Close: %v, want %s", err, codes.Unavailable)
			}
		})
	}
}
