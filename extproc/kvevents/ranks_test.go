package kvevents

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/kvwire"
)

// rankBatch is stored(h) tagged with a data-parallel rank, as each of
// vLLM's per-rank publishers tags its batches.
func rankBatch(rank int, h uint64) kvwire.EventBatch {
	b := stored("", h)
	b.DataParallelRank = &rank
	return b
}

// TestRanksSharingATopic: vLLM's data-parallel ranks share one
// kv-events configuration, so every rank's publisher uses the same topic,
// naming one endpoint, and tags its batches with its rank. On the central
// socket each batch goes to its rank's endpoint, each rank a stream of
// its own, instead of all of them landing on the endpoint the topic names.
func TestRanksSharingATopic(t *testing.T) {
	const rank0, rank1 = "10.0.0.5:8000", "10.0.0.5:8001"
	f := newFixture(t, Config{Bind: "tcp://127.0.0.1:0"})
	f.sub.AddEndpoint(rank0, Source{Server: "vllm-0", Rank: 0})
	f.sub.AddEndpoint(rank1, Source{Server: "vllm-0", Rank: 1})
	pubs := []*kvwire.Publisher{realPublisher(t, f, rank0), realPublisher(t, f, rank0)}
	f.eventually("both ranks' first batches", func() bool {
		for rank, pub := range pubs {
			if err := pub.Publish(rankBatch(rank, uint64(100+rank))); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond)
		return f.holds(rank0, 100) > 0 && f.holds(rank1, 101) > 0
	})
	if f.holds(rank0, 101) != 0 || f.holds(rank1, 100) != 0 {
		t.Fatal("a rank's blocks were applied to another rank's endpoint")
	}
	if got := testutil.ToFloat64(f.sub.m.dropped.WithLabelValues(dropConflictingStream)); got != 0 {
		t.Fatalf("%v messages dropped as another connection's stream: the ranks' streams were mixed", got)
	}
	// A rank the pool has no endpoint for stays on the topic's endpoint.
	if err := pubs[0].Publish(rankBatch(7, 107)); err != nil {
		t.Fatal(err)
	}
	f.eventually("the batch of an unknown rank", func() bool { return f.holds(rank0, 107) == 1 })
}

// TestRankSubscribedOnAnotherRanksSocket: an endpoint subscribed to the
// socket of another rank of its server (each vLLM rank publishes on its
// own port, the configured one plus its rank) gets none of that rank's
// batches: they belong to the other rank's endpoint, which follows them
// on its own connection.
func TestRankSubscribedOnAnotherRanksSocket(t *testing.T) {
	const rank0, rank1 = "10.0.0.6:8000", "10.0.0.6:8001"
	f := newFixture(t, Config{})
	p := newRawPub(t, "", "")
	f.sub.AddEndpoint(rank0, Source{Events: p.addr(), Server: "vllm-0", Rank: 0})
	f.sub.AddEndpoint(rank1, Source{Events: p.addr(), Server: "vllm-0", Rank: 1})
	f.eventually("both subscriptions", func() bool { return p.pub.Subscribers() == 2 })
	p.sendBatch(0, rankBatch(0, 100))
	p.sendBatch(1, rankBatch(0, 101))
	f.eventually("rank 0's batches", func() bool { return f.holds(rank0, 101) == 1 })
	// The second connection's copies are another connection's stream.
	f.eventually("the second copies", func() bool {
		return testutil.ToFloat64(f.sub.m.dropped.WithLabelValues(dropConflictingStream)) == 2
	})
	if f.holds(rank1, 100) != 0 || f.holds(rank1, 101) != 0 {
		t.Fatal("rank 0's blocks were applied to rank 1's endpoint")
	}
}
