package agent

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// TestLeaseHeap: removals from anywhere keep the heap's order and every
// lease's index, which releaseLocked relies on.
func TestLeaseHeap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name     string
		deadline []int // seconds after t0, lease i is "l<i>"
		remove   []int // indices into deadline, in order
		want     []string
	}{
		{"pop order", []int{5, 1, 4, 2, 3}, nil, []string{"l1", "l3", "l4", "l2", "l0"}},
		{"remove the head", []int{5, 1, 4, 2, 3}, []int{1}, []string{"l3", "l4", "l2", "l0"}},
		{"remove the last", []int{1, 2, 3}, []int{2}, []string{"l0", "l1"}},
		{"remove inner ones", []int{3, 9, 1, 7, 5, 2}, []int{4, 0, 3}, []string{"l2", "l5", "l1"}},
		{"remove all", []int{2, 1}, []int{0, 1}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h leaseHeap
			ls := make([]*lease, len(tc.deadline))
			for i, d := range tc.deadline {
				ls[i] = &lease{id: fmt.Sprint("l", i), deadline: t0.Add(time.Duration(d) * time.Second)}
				heap.Push(&h, ls[i])
			}
			for _, i := range tc.remove {
				heap.Remove(&h, ls[i].at)
				for j, l := range h {
					if l.at != j {
						t.Fatalf("after removing l%d, %s has index %d at %d", i, l.id, l.at, j)
					}
				}
			}
			var got []string
			for h.Len() > 0 {
				got = append(got, heap.Pop(&h).(*lease).id)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestLeasesExpireInDeadlineOrder: a lease due before those already held
// re-arms the expiry timer (else it would wait for the later deadline),
// and a lease not due stays held.
func TestLeasesExpireInDeadlineOrder(t *testing.T) {
	p := newNode(t, "p", 0)
	p.region(t, "P", blockBytes, 4, "")
	// Bounded, so that a lease that never expires fails the test.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	watch, err := p.client.WatchReleases(ctx, &agentv1.WatchReleasesRequest{EngineId: "P"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the watch to be registered", func() bool {
		p.a.mu.Lock()
		defer p.a.mu.Unlock()
		return len(p.a.watchers["P"]) == 1
	})
	for i, ms := range []uint32{3600_000, 400, 40} {
		if _, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: []uint64{uint64(i)},
			Hold: &agentv1.Hold{RequestId: fmt.Sprint("r", i), LeaseMs: ms}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"r2", "r1"} {
		rel, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if rel.RequestId != want || !rel.Expired {
			t.Fatalf("release %+v, want %s expired", rel, want)
		}
	}
	p.a.mu.Lock()
	defer p.a.mu.Unlock()
	if _, ok := p.a.leases["r0"]; !ok || len(p.a.leases) != 1 || len(p.a.deadlines) != 1 {
		t.Fatalf("leases %v, %d deadlines; want r0 alone", p.a.leases, len(p.a.deadlines))
	}
}
