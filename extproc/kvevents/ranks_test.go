package kvevents

import (
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
	ktestutil "github.com/kvgate/kvgate/internal/testutil"
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
	// Rank 1's connection carries rank 0's tags: reported.
	if got := testutil.ToFloat64(f.sub.m.rankMismatches.WithLabelValues(mismatchStart)); got != 2 {
		t.Fatalf("%v rank mismatches counted for the 2 batches on another rank's socket", got)
	}
}

// TestRanksOfAPodNotStartingAtZero: vLLM tags a batch with its global
// data-parallel rank, while an endpoint's Rank is its port's place in the
// pod. A pod serving global ranks 1 and 2 on its places 0 and 1 (each
// rank's socket subscribed by the rank's endpoint) keeps each rank's
// blocks on its own endpoint: the pod's first rank is learned from the
// connections, and tag 1 is place 0, not the endpoint at place 1.
func TestRanksOfAPodNotStartingAtZero(t *testing.T) {
	const place0, place1 = "10.0.0.7:8000", "10.0.0.7:8001"
	f := newFixture(t, Config{})
	pubs := []*rawPub{newRawPub(t, "", ""), newRawPub(t, "", "")}
	f.sub.AddEndpoint(place0, Source{Events: pubs[0].addr(), Server: "vllm-1", Rank: 0})
	f.sub.AddEndpoint(place1, Source{Events: pubs[1].addr(), Server: "vllm-1", Rank: 1})
	f.eventually("both subscriptions", func() bool { return pubs[0].subscribed() && pubs[1].subscribed() })
	pubs[0].sendBatch(0, rankBatch(1, 100))
	pubs[1].sendBatch(0, rankBatch(2, 101))
	f.eventually("each rank's batch", func() bool { return f.holds(place0, 100) == 1 && f.holds(place1, 101) == 1 })
	if f.holds(place1, 100) != 0 || f.holds(place0, 101) != 0 {
		t.Fatal("a rank's blocks were applied to another rank's endpoint")
	}
	for _, reason := range []string{mismatchStart, mismatchNoEndpoint} {
		if got := testutil.ToFloat64(f.sub.m.rankMismatches.WithLabelValues(reason)); got != 0 {
			t.Errorf("%v rank mismatches (%s) counted for tags that fit", got, reason)
		}
	}
}

// TestCentralSocketBindsAPortPerRank: vLLM's rank r connects its
// publisher to the configured endpoint's port plus r, so a central socket
// of one port hears rank 0 alone. With BindRanks it binds a port per rank.
// Here the pod serves global ranks 8 and 9 and, as llm-d's wide-EP pods
// do, configures the picker's port less its first rank, so its ranks
// reach the picker's first two ports; both share one topic (rank 0's
// endpoint) and each batch still lands on its rank's endpoint.
func TestCentralSocketBindsAPortPerRank(t *testing.T) {
	const place0, place1 = "10.0.0.8:8000", "10.0.0.8:8001"
	const first = 8
	f := newCentralFixture(t, Config{BindRanks: 2})
	f.sub.AddEndpoint(place0, Source{Server: "vllm-2", Rank: 0})
	f.sub.AddEndpoint(place1, Source{Server: "vllm-2", Rank: 1})
	port := f.sub.Addr().(*net.TCPAddr).Port
	configured := "tcp://127.0.0.1:" + strconv.Itoa(port-first)
	var pubs []*kvwire.Publisher
	for rank := first; rank < first+2; rank++ {
		endpoint, err := kvwire.OffsetPort(configured, rank)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kvwire.NewPublisher(t.Context(), kvwire.PublisherConfig{Endpoint: endpoint, Topic: kvwire.BuildTopic(place0, "m")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		pubs = append(pubs, pub)
	}
	f.eventually("both ranks' first batches", func() bool {
		for i, pub := range pubs {
			if err := pub.Publish(rankBatch(first+i, uint64(200+i))); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond)
		return f.holds(place0, 200) > 0 && f.holds(place1, 201) > 0
	})
	if f.holds(place0, 201) != 0 || f.holds(place1, 200) != 0 {
		t.Fatal("a rank's blocks were applied to another rank's endpoint")
	}
}

// newCentralFixture is a fixture whose central socket binds
// cfg.BindRanks consecutive loopback ports, retried on ports another
// process took between the probe and the bind.
func newCentralFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	var err error
	for range 20 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		f := &fixture{t: t, idx: kvindex.New(kvindex.Config{MaxEntries: 10000, Shards: 4}), reg: prometheus.NewRegistry()}
		cfg.Bind, cfg.Registerer = "tcp://127.0.0.1:"+strconv.Itoa(port), f.reg
		if f.sub, err = New(t.Context(), f.idx, cfg); err == nil {
			t.Cleanup(func() { _ = f.sub.Close() })
			return f
		}
	}
	t.Fatalf("no %d free consecutive ports: %v", cfg.BindRanks, err)
	return nil
}

// TestCentralRankPortsShareMaxConns: the ports of a multi-port central
// socket share MaxConns, which with the memory budget bounds what the
// intake holds, instead of each admitting as many.
func TestCentralRankPortsShareMaxConns(t *testing.T) {
	f := newCentralFixture(t, Config{BindRanks: 2, MaxConns: 2, HandshakeTimeout: time.Hour})
	dialRaw(t, f) // the first port's one connection, handshaking
	closedByPeer(t, dialRaw(t, f))
	f.eventually("the rejection counted", func() bool {
		return testutil.ToFloat64(f.sub.m.rejected.WithLabelValues("max_conns")) == 1
	})
}

// TestRankTagsThatDoNotFit: when the tags cannot be placed (a central
// socket of one port, whose connections do not tell their rank, and a pod
// whose ranks do not start at 0), the batch stays on the endpoint its
// topic names, and the mismatch is counted and logged once for the
// server, naming the endpoint.
func TestRankTagsThatDoNotFit(t *testing.T) {
	const place0, place1 = "10.0.0.9:8000", "10.0.0.9:8001"
	var logs ktestutil.SyncBuffer
	f := newFixture(t, Config{Bind: "tcp://127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	f.sub.AddEndpoint(place0, Source{Server: "vllm-3", Rank: 0})
	f.sub.AddEndpoint(place1, Source{Server: "vllm-3", Rank: 1})
	pub := realPublisher(t, f, place0)
	mismatches := f.sub.m.rankMismatches.WithLabelValues(mismatchNoEndpoint)
	f.eventually("batches of rank 9, each counted", func() bool {
		if err := pub.Publish(rankBatch(9, 300)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		return f.holds(place0, 300) > 0 && testutil.ToFloat64(mismatches) >= 2
	})
	out := logs.String()
	if n := strings.Count(out, "data-parallel rank tag does not fit"); n != 1 {
		t.Fatalf("the mismatch was logged %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "endpoint="+place0) || !strings.Contains(out, "server=vllm-3") {
		t.Fatalf("the log does not name the endpoint and server:\n%s", out)
	}
}

// TestUnreachableRankSocketReported: a data-parallel rank subscribed on a
// port nothing listens on (vLLM moved it by the pod's first rank, not by
// the endpoint's place) is counted and logged once, naming the endpoint,
// instead of redialing silently.
func TestUnreachableRankSocketReported(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "tcp://" + ln.Addr().String()
	_ = ln.Close()
	var logs ktestutil.SyncBuffer
	f := newFixture(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const place1 = "10.0.0.10:8001"
	f.sub.AddEndpoint(place1, Source{Events: addr, Server: "vllm-4", Rank: 1})
	f.eventually("the report", func() bool { return testutil.ToFloat64(f.sub.m.unreachable) == 1 })
	out := logs.String()
	if !strings.Contains(out, "publisher is unreachable") || !strings.Contains(out, "endpoint="+place1) || !strings.Contains(out, "server=vllm-4") {
		t.Fatalf("the log does not name the endpoint and its server:\n%s", out)
	}
}
