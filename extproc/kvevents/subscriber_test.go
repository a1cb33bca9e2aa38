package kvevents

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/zmtp"
)

// testTimeout bounds every wait on the network so that a broken test fails
// instead of hanging; no test asserts how long anything takes.
const testTimeout = 10 * time.Second

type fixture struct {
	t   *testing.T
	idx *kvindex.Index
	sub *Subscriber
	reg *prometheus.Registry
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	return newFixtureSized(t, cfg, 10000)
}

// newFixtureSized is newFixture with an index of maxEntries.
func newFixtureSized(t *testing.T, cfg Config, maxEntries int) *fixture {
	t.Helper()
	f := &fixture{t: t, idx: kvindex.New(kvindex.Config{MaxEntries: maxEntries, Shards: 4}), reg: prometheus.NewRegistry()}
	cfg.Registerer = f.reg
	sub, err := New(t.Context(), f.idx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	f.sub = sub
	return f
}

// holds reports the score of endpoint for a one-block prompt.
func (f *fixture) holds(ep string, h uint64) float64 {
	out := make([]float64, 1)
	f.idx.Lookup([]uint64{h}, []string{ep}, out)
	return out[0]
}

// eventually polls cond until it holds or testTimeout passes.
func (f *fixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func stored(tier string, hashes ...uint64) kvwire.EventBatch {
	hs := make([]kvwire.Hash, len(hashes))
	for i, h := range hashes {
		hs[i] = kvwire.Uint64Hash(h)
	}
	return kvwire.EventBatch{TS: 1, Events: []kvwire.Event{kvwire.BlockStored{BlockHashes: hs, BlockSize: 16, Medium: tier}}}
}

func removed(medium string, hashes ...uint64) kvwire.EventBatch {
	hs := make([]kvwire.Hash, len(hashes))
	for i, h := range hashes {
		hs[i] = kvwire.Uint64Hash(h)
	}
	return kvwire.EventBatch{TS: 1, Events: []kvwire.Event{kvwire.BlockRemoved{BlockHashes: hs, Medium: medium}}}
}

// rawPub is a hand-driven PUB socket that sends chosen sequence numbers.
type rawPub struct {
	t      *testing.T
	pub    *zmtp.Pub
	srv    *zmtp.Server // nil when it connects
	bound  string
	cancel context.CancelFunc
	done   chan struct{}
	topic  string
}

// newRawPub binds a PUB socket on loopback, or connects it to addr.
func newRawPub(t *testing.T, topic, connectTo string) *rawPub {
	t.Helper()
	p := &rawPub{t: t, topic: topic}
	p.start(connectTo, "tcp://127.0.0.1:*")
	t.Cleanup(p.close)
	return p
}

func (p *rawPub) start(connectTo, bind string) {
	p.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p.pub, p.cancel, p.done = zmtp.NewPub(zmtp.PubConfig{}), cancel, make(chan struct{})
	hs := zmtp.HandshakeConfig{Type: zmtp.PUB}
	if connectTo != "" {
		go func() {
			defer close(p.done)
			zmtp.Redial(ctx, connectTo, zmtp.DialConfig{HandshakeConfig: hs, RedialMin: 10 * time.Millisecond}, p.pub.Serve)
		}()
		return
	}
	close(p.done)
	srv, err := zmtp.Listen(ctx, bind, zmtp.ServerConfig{HandshakeConfig: hs}, p.pub.Serve)
	if err != nil {
		cancel()
		p.t.Fatal(err)
	}
	p.srv, p.bound = srv, "tcp://"+srv.Addr().String()
}

// close stops the socket and its connections.
func (p *rawPub) close() {
	p.cancel()
	if p.srv != nil {
		_ = p.srv.Close()
	}
	<-p.done
}

// restart replaces a bound socket with a fresh one on the same address,
// as a restarted server does.
func (p *rawPub) restart() {
	p.t.Helper()
	p.close()
	p.start("", p.bound)
}

func (p *rawPub) addr() string { return p.bound }

// subscribed reports whether a connected peer subscribed.
func (p *rawPub) subscribed() bool { return p.pub.Subscribers() > 0 }

func (p *rawPub) send(seq uint64, payload []byte) {
	p.pub.Send([]byte(p.topic), binary.BigEndian.AppendUint64(nil, seq), payload)
}

func (p *rawPub) sendBatch(seq uint64, b kvwire.EventBatch) {
	p.t.Helper()
	payload, err := kvwire.Encode(b, kvwire.EncodingArray)
	if err != nil {
		p.t.Fatal(err)
	}
	p.send(seq, payload)
}

// TestPublisherToIndex runs the real publisher into the subscriber in both
// connect modes and both encodings.
func TestPublisherToIndex(t *testing.T) {
	for _, central := range []bool{true, false} {
		for _, enc := range []kvwire.Encoding{kvwire.EncodingArray, kvwire.EncodingMap} {
			name := "per-endpoint/" + enc.String()
			if central {
				name = "central/" + enc.String()
			}
			t.Run(name, func(t *testing.T) {
				const ep = "10.0.0.1:8000"
				cfg := Config{}
				if central {
					cfg.Bind = "tcp://127.0.0.1:*"
				}
				f := newFixture(t, cfg)
				pcfg := kvwire.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Topic: kvwire.BuildTopic(ep, "qwen"), Encoding: enc}
				if central {
					pcfg.Endpoint = "tcp://" + f.sub.Addr().String()
				}
				pub, err := kvwire.NewPublisher(t.Context(), pcfg)
				if err != nil {
					t.Fatal(err)
				}
				defer pub.Close()
				if central {
					f.sub.AddEndpoint(ep, Source{})
				} else {
					f.sub.AddEndpoint(ep, Source{Events: "tcp://" + pub.Addr().String()})
				}
				// Publish until the first batch lands: the slow joiner
				// loses what goes out before the subscription arrives.
				f.eventually("the first batch", func() bool {
					if err := pub.Publish(stored(kvwire.MediumGPU, 1)); err != nil {
						t.Fatal(err)
					}
					time.Sleep(10 * time.Millisecond)
					return f.holds(ep, 1) == 1
				})
				// Block 4 stays: its removal names the GPU tier, not the
				// CPU tier it is in. Block 6 is in a storage tier only,
				// which scores as an offload tier does, not as GPU.
				for _, b := range []kvwire.EventBatch{stored("", 2, 3), stored(kvwire.MediumCPU, 4, 5), removed("", 4), removed(kvwire.MediumCPU, 5),
					stored("STORAGE", 6), stored(kvwire.MediumGPU, 9)} {
					if err := pub.Publish(b); err != nil {
						t.Fatal(err)
					}
				}
				f.eventually("the last batch", func() bool { return f.holds(ep, 9) == 1 })
				out := make([]float64, 1)
				f.idx.Lookup([]uint64{1, 2, 3, 4, 5}, []string{ep}, out)
				if want := 3 + kvindex.WeightCPU; out[0] != want {
					t.Fatalf("score %v, want %v", out[0], want)
				}
				if got := f.holds(ep, 6); got != kvindex.WeightCPU {
					t.Fatalf("block 6, stored in STORAGE only, scores %v, want %v", got, kvindex.WeightCPU)
				}
				if got := testutil.ToFloat64(f.sub.m.gaps); got != 0 {
					t.Fatalf("%v gaps on a lossless stream", got)
				}
				if got := testutil.ToFloat64(f.sub.m.events.WithLabelValues(kvwire.TypeBlockRemoved)); got != 2 {
					t.Fatalf("BlockRemoved events = %v, want 2", got)
				}
			})
		}
	}
}

// TestAllBlocksClearedKeepsOffloadTiers: vLLM's AllBlocksCleared is its
// GPU block pool's reset; the blocks an offloading connector holds (events
// with a CPU or storage medium) are not cleared by it.
func TestAllBlocksClearedKeepsOffloadTiers(t *testing.T) {
	const ep = "10.0.0.9:8000"
	f := newFixture(t, Config{})
	p := followed(t, f, ep, "")
	p.sendBatch(0, stored("", 1, 2))
	p.sendBatch(1, stored(kvwire.MediumCPU, 2, 3))
	p.sendBatch(2, stored("STORAGE", 4))
	p.sendBatch(3, kvwire.EventBatch{TS: 1, Events: []kvwire.Event{kvwire.AllBlocksCleared{}}})
	p.sendBatch(4, stored("", 5))
	f.eventually("the batch after the reset", func() bool { return f.holds(ep, 5) == 1 })
	for h, want := range map[uint64]float64{1: 0, 2: kvindex.WeightCPU, 3: kvindex.WeightCPU, 4: kvindex.WeightCPU} {
		if got := f.holds(ep, h); got != want {
			t.Errorf("block %d scores %v after AllBlocksCleared, want %v", h, got, want)
		}
	}
}

// followed connects the subscriber to a raw publisher for ep and waits
// for the subscription.
func followed(t *testing.T, f *fixture, ep string, replay string) *rawPub {
	t.Helper()
	p := newRawPub(t, "", "")
	f.sub.AddEndpoint(ep, Source{Events: p.addr(), Replay: replay})
	f.eventually("the subscription", p.subscribed)
	return p
}

func TestGapWithoutReplayClears(t *testing.T) {
	const ep = "10.0.0.2:8000"
	f := newFixture(t, Config{})
	p := followed(t, f, ep, "")
	p.sendBatch(0, stored("", 10))
	p.sendBatch(1, stored("", 11))
	f.eventually("seq 1", func() bool { return f.holds(ep, 11) == 1 })
	p.sendBatch(3, stored("", 20))
	f.eventually("seq 3", func() bool { return f.holds(ep, 20) == 1 })
	if f.holds(ep, 10) != 0 || f.holds(ep, 11) != 0 {
		t.Fatal("entries from before the gap survived")
	}
	if got := testutil.ToFloat64(f.sub.m.gaps); got != 1 {
		t.Fatalf("gaps = %v, want 1", got)
	}
}

func TestGapFilledByReplay(t *testing.T) {
	const ep = "10.0.0.3:8000"
	f := newFixture(t, Config{})
	// The real publisher holds batches 0-4 for replay; the live stream,
	// sent by hand, loses 2 and 3.
	store, err := kvwire.NewPublisher(t.Context(), kvwire.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	batches := make([]kvwire.EventBatch, 5)
	for i := range batches {
		batches[i] = stored("", uint64(100+i))
		if err := store.Publish(batches[i]); err != nil {
			t.Fatal(err)
		}
	}
	p := followed(t, f, ep, "tcp://"+store.ReplayAddr().String())
	p.sendBatch(0, batches[0])
	p.sendBatch(1, batches[1])
	p.sendBatch(4, batches[4])
	f.eventually("seq 4", func() bool { return f.holds(ep, 104) == 1 })
	for h := uint64(100); h <= 104; h++ {
		if f.holds(ep, h) != 1 {
			t.Errorf("block %d missing after replay", h)
		}
	}
	if got := testutil.ToFloat64(f.sub.m.replays.WithLabelValues(replayOK)); got != 1 {
		t.Fatalf("successful replays = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.sub.m.gaps); got != 1 {
		t.Fatalf("gaps = %v, want 1", got)
	}
}

func TestReplayMissingStartClears(t *testing.T) {
	const ep = "10.0.0.4:8000"
	f := newFixture(t, Config{})
	// The publisher keeps only the last two batches (3 and 4): the gap
	// 1-2 cannot be filled, so what came before it goes.
	store, err := kvwire.NewPublisher(t.Context(), kvwire.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", ReplaySize: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	batches := make([]kvwire.EventBatch, 5)
	for i := range batches {
		batches[i] = stored("", uint64(200+i))
		if err := store.Publish(batches[i]); err != nil {
			t.Fatal(err)
		}
	}
	p := followed(t, f, ep, "tcp://"+store.ReplayAddr().String())
	p.sendBatch(0, batches[0])
	f.eventually("seq 0", func() bool { return f.holds(ep, 200) == 1 })
	p.sendBatch(4, batches[4])
	f.eventually("seq 4", func() bool { return f.holds(ep, 204) == 1 })
	if f.holds(ep, 200) != 0 || f.holds(ep, 203) != 1 {
		t.Fatalf("after a partial replay: block 200 %v (want 0), 203 %v (want 1)", f.holds(ep, 200), f.holds(ep, 203))
	}
	if got := testutil.ToFloat64(f.sub.m.replays.WithLabelValues(replayPartial)); got != 1 {
		t.Fatalf("partial replays = %v, want 1", got)
	}
}

func TestReplayUnreachableClears(t *testing.T) {
	const ep = "10.0.0.5:8000"
	f := newFixture(t, Config{ReplayTimeout: 200 * time.Millisecond})
	// Nothing listens on the replay address.
	dead := newRawPub(t, "", "")
	addr := dead.addr()
	dead.close()
	p := followed(t, f, ep, addr)
	p.sendBatch(0, stored("", 300))
	f.eventually("seq 0", func() bool { return f.holds(ep, 300) == 1 })
	p.sendBatch(2, stored("", 302))
	f.eventually("seq 2", func() bool { return f.holds(ep, 302) == 1 })
	if f.holds(ep, 300) != 0 {
		t.Fatal("entries from before the gap survived a failed replay")
	}
	if got := testutil.ToFloat64(f.sub.m.replays.WithLabelValues(replayFailed)); got != 1 {
		t.Fatalf("failed replays = %v, want 1", got)
	}
}

func TestPublisherRestartClears(t *testing.T) {
	const ep = "10.0.0.6:8000"
	f := newFixture(t, Config{})
	p := followed(t, f, ep, "")
	p.sendBatch(0, stored("", 30))
	p.sendBatch(1, stored("", 31))
	f.eventually("seq 1", func() bool { return f.holds(ep, 31) == 1 })
	p.restart()
	f.eventually("the new subscription", p.subscribed)
	p.sendBatch(0, stored("", 40))
	f.eventually("the restarted stream", func() bool { return f.holds(ep, 40) == 1 })
	if f.holds(ep, 30) != 0 || f.holds(ep, 31) != 0 {
		t.Fatal("entries of the previous publisher survived its restart")
	}
	if got := testutil.ToFloat64(f.sub.m.restarts); got != 1 {
		t.Fatalf("restarts = %v, want 1", got)
	}
}

func TestSlowJoinerIsNotAGap(t *testing.T) {
	const ep = "10.0.0.7:8000"
	f := newFixture(t, Config{})
	p := followed(t, f, ep, "")
	p.sendBatch(7, stored("", 70))
	p.sendBatch(8, stored("", 71))
	f.eventually("seq 8", func() bool { return f.holds(ep, 71) == 1 })
	if f.holds(ep, 70) != 1 {
		t.Fatal("first batch lost")
	}
	if got := testutil.ToFloat64(f.sub.m.gaps) + testutil.ToFloat64(f.sub.m.restarts); got != 0 {
		t.Fatalf("gaps+restarts = %v, want 0", got)
	}
}

func TestEndpointRemoved(t *testing.T) {
	const ep, other = "10.0.0.8:8000", "10.0.0.9:8000"
	f := newFixture(t, Config{})
	p := followed(t, f, ep, "")
	q := followed(t, f, other, "")
	p.sendBatch(0, stored("", 50))
	q.sendBatch(0, stored("", 50))
	f.eventually("both endpoints", func() bool { return f.holds(ep, 50) == 1 && f.holds(other, 50) == 1 })
	f.sub.EndpointRemoved(ep)
	f.eventually("the removal", func() bool { return f.holds(ep, 50) == 0 })
	f.eventually("the socket to close", func() bool { return !p.subscribed() })
	if f.holds(other, 50) != 1 {
		t.Fatal("removing one endpoint cleared another")
	}
	f.sub.mu.Lock()
	_, still := f.sub.sources[ep]
	f.sub.mu.Unlock()
	if still {
		t.Fatal("removed endpoint still configured")
	}
}

func TestCentralDropsMalformed(t *testing.T) {
	f := newFixture(t, Config{Bind: "tcp://127.0.0.1:*"})
	bad := newRawPub(t, "not-a-kv-topic", "tcp://"+f.sub.Addr().String())
	good := newRawPub(t, kvwire.BuildTopic("10.0.1.1:8000", "m"), "tcp://"+f.sub.Addr().String())
	stray := newRawPub(t, kvwire.BuildTopic("10.0.9.9:8000", "m"), "tcp://"+f.sub.Addr().String())
	f.sub.AddEndpoint("10.0.1.1:8000", Source{})
	f.eventually("the subscriptions", func() bool { return bad.subscribed() && good.subscribed() && stray.subscribed() })
	bad.sendBatch(0, stored("", 1))
	stray.sendBatch(0, stored("", 1))
	good.send(0, []byte{0x01})
	good.pub.Send([]byte(good.topic), []byte{1})
	f.eventually("the drops", func() bool {
		return testutil.ToFloat64(f.sub.m.dropped.WithLabelValues(dropBadTopic)) == 1 &&
			testutil.ToFloat64(f.sub.m.dropped.WithLabelValues(dropUnknownEndpoint)) == 1 &&
			testutil.ToFloat64(f.sub.m.decodeErrors) == 1 &&
			testutil.ToFloat64(f.sub.m.dropped.WithLabelValues(dropBadFrames)) == 1
	})
}

func TestMetricsRegistered(t *testing.T) {
	f := newFixture(t, Config{})
	if err := f.idx.Add("10.0.0.1:1", kvindex.TierGPU, []uint64{1, 2}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"kvgate_kvindex_entries":                  2,
		"inference_extension_prefix_indexer_size": 2,
		"kvgate_kvindex_endpoints":                1,
	} {
		n, err := testutil.GatherAndCount(f.reg, name)
		if err != nil || n != 1 {
			t.Fatalf("%s: %d series, %v", name, n, err)
		}
		got, err := gatherValue(f.reg, name)
		if err != nil || got != want {
			t.Fatalf("%s = %v, %v; want %v", name, got, err, want)
		}
	}
	if problems, err := testutil.GatherAndLint(f.reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	// A second subscriber on the same registry leaves GIE's name to the
	// first but cannot register its own names twice.
	if _, err := New(t.Context(), f.idx, Config{Registerer: f.reg}); err == nil || !strings.Contains(err.Error(), "register") {
		t.Fatalf("second registration: %v", err)
	}
}

func gatherValue(g prometheus.Gatherer, name string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue(), nil
		}
	}
	return 0, nil
}

func TestSequenceStatesAreBounded(t *testing.T) {
	f := newFixture(t, Config{})
	w := &worker{s: f.sub, states: map[string]*seqState{}, maxEndpoints: 2}
	payload, err := kvwire.Encode(stored("", 1), kvwire.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{"a:1", "b:1", "c:1"} {
		f.sub.AddEndpoint(ep, Source{}) // only the pool's endpoints start a stream
	}
	p := &peer{}
	for i, ep := range []string{"a:1", "b:1", "a:1", "c:1"} {
		w.handle(item{endpoint: ep, seq: uint64(5 + i), payload: payload, peer: p})
	}
	if _, ok := w.states["b:1"]; ok || len(w.states) != 2 {
		t.Fatalf("states %v: want a:1 and c:1, b:1 (least recently heard) forgotten", w.states)
	}
	if got := testutil.ToFloat64(f.sub.m.forgotten); got != 1 {
		t.Fatalf("forgotten = %v, want 1", got)
	}
}

func TestRestartReplaysNewPublishersStart(t *testing.T) {
	const ep = "10.0.0.10:8000"
	f := newFixture(t, Config{})
	// The restarted publisher has sent 0-2; the subscriber hears only 2.
	fresh, err := kvwire.NewPublisher(t.Context(), kvwire.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	batches := []kvwire.EventBatch{stored("", 500), stored("", 501), stored("", 502)}
	for _, b := range batches {
		if err := fresh.Publish(b); err != nil {
			t.Fatal(err)
		}
	}
	p := followed(t, f, ep, "tcp://"+fresh.ReplayAddr().String())
	for seq := range uint64(5) {
		p.sendBatch(seq, stored("", 400+seq))
	}
	f.eventually("the old stream", func() bool { return f.holds(ep, 404) == 1 })
	p.restart()
	f.eventually("the new subscription", p.subscribed)
	p.sendBatch(2, batches[2])
	f.eventually("the new stream", func() bool { return f.holds(ep, 502) == 1 })
	if f.holds(ep, 500) != 1 || f.holds(ep, 501) != 1 {
		t.Fatal("the new publisher's first batches were not replayed")
	}
	if f.holds(ep, 400) != 0 || f.holds(ep, 404) != 0 {
		t.Fatal("the old publisher's entries survived its restart")
	}
	if got := testutil.ToFloat64(f.sub.m.restarts); got != 1 {
		t.Fatalf("restarts = %v, want 1", got)
	}
}

// TestBatchQueuedAfterRemovalIsDropped: a reader that resolved an endpoint
// just before EndpointRemoved (a central socket's topic, or a rank's batch
// rerouted from another rank's connection, whose reader the removal does
// not wait for) queues its batch behind the removal. The batch must not
// put entries in the index for an endpoint that left: nothing would ever
// remove them. The interleaving is made deterministic by queueing the
// late batch by hand, as that reader would.
func TestBatchQueuedAfterRemovalIsDropped(t *testing.T) {
	const gone, stays = "10.0.0.8:8000", "10.0.0.9:8000"
	f := newFixture(t, Config{Workers: 1})
	f.sub.AddEndpoint(gone, Source{})
	f.sub.AddEndpoint(stays, Source{})
	f.sub.EndpointRemoved(gone)
	p := &peer{mem: &connBudget{g: &f.sub.mem, max: DefaultPublisherMemory}}
	for _, ep := range []string{gone, stays} {
		payload, err := kvwire.Encode(stored("", 60), kvwire.EncodingArray)
		if err != nil {
			t.Fatal(err)
		}
		f.sub.workerOf(ep).q <- item{endpoint: ep, payload: payload, peer: p}
	}
	// One worker applies in order: once the second batch is in, the
	// first was handled.
	f.eventually("the configured endpoint's batch", func() bool { return f.holds(stays, 60) == 1 })
	if f.holds(gone, 60) != 0 {
		t.Fatal("a batch queued after its endpoint's removal put entries in the index")
	}
}
