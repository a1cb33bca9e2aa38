package kvevents

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/kvwire"
	kvtest "github.com/kvgate/kvgate/internal/testutil"
)

// Regression tests for the KV-event port under hostile peers (issue 13,
// H1-H3 and the forged-event findings). Each reproduces the attack on the
// central socket and then requires a real publisher's events to reach the
// index within reachDeadline: a deadline the test fails at, not a timing
// claim.

const reachDeadline = time.Second

// greeting is a ZMTP 3.0 NULL greeting.
func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// readyPUB is a READY command announcing a PUB socket.
func readyPUB() []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, 3)
	body = append(body, "PUB"...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// longFrame is a frame header declaring size bytes (flags: long, plus
// extra).
func longFrame(extra byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{0x02 | extra}, size)
}

// centralFixture binds the central socket on an explicit loopback address
// (no "*": the form `kvgate up` uses) and adds ep as a central endpoint.
func centralFixture(t *testing.T, cfg Config, ep string) *fixture {
	t.Helper()
	cfg.Bind = "tcp://127.0.0.1:0"
	f := newFixture(t, cfg)
	f.sub.AddEndpoint(ep, Source{})
	return f
}

// realPublisher is kvgate's publisher connecting to the central socket, as
// vLLM's does with an address without "*".
func realPublisher(t *testing.T, f *fixture, ep string) *kvwire.Publisher {
	t.Helper()
	pub, err := kvwire.NewPublisher(t.Context(), kvwire.PublisherConfig{
		Endpoint: "tcp://" + f.sub.Addr().String(), Topic: kvwire.BuildTopic(ep, "m"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// reach publishes block h until the index has it, failing after within.
// Publishing again beats the slow-joiner loss; the index then counts the
// block's copies, which these tests never remove.
func reach(t *testing.T, f *fixture, pub *kvwire.Publisher, ep string, h uint64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for f.holds(ep, h) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("block %d of %s not in the index %v after the publisher started", h, ep, within)
		}
		if err := pub.Publish(stored("", h)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dialRaw connects a raw TCP peer to the central socket.
func dialRaw(t *testing.T, f *fixture) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", f.sub.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedByPeer waits for the subscriber to close c.
func closedByPeer(t *testing.T, c net.Conn) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the hostile connection was not closed: %v", err)
	}
}

// H1: one 73-byte message (greeting, then a frame declaring 2^62 bytes)
// killed the picker. Now the connection is dropped and publishers carry
// on, also for a declared 2^40 and for the declaration after READY.
func TestHugeFrameDropsConnection(t *testing.T) {
	const ep = "10.1.0.1:8000"
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"73 bytes, 2^62 command", append(greeting(), longFrame(0x04, 1<<62)...)},
		{"2^40 command", append(greeting(), longFrame(0x04, 1<<40)...)},
		{"2^62 message after READY", append(append(greeting(), readyPUB()...), longFrame(0, 1<<62)...)},
		{"2^64-1 message after READY", append(append(greeting(), readyPUB()...), longFrame(0x01, ^uint64(0))...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := centralFixture(t, Config{}, ep)
			pub := realPublisher(t, f, ep)
			reach(t, f, pub, ep, 1, testTimeout)
			c := dialRaw(t, f)
			if tc.name == "73 bytes, 2^62 command" && len(tc.msg) != 73 {
				t.Fatalf("%d bytes", len(tc.msg))
			}
			if _, err := c.Write(tc.msg); err != nil {
				t.Fatal(err)
			}
			closedByPeer(t, c)
			reach(t, f, pub, ep, 2, reachDeadline)
			if f.holds(ep, 1) != 1 {
				t.Fatal("the publisher's earlier entries were lost")
			}
		})
	}
}

// H2: a connect-and-close probe on an explicitly bound address wedged the
// accept loop for good.
func TestProbeDoesNotWedgeBoundSocket(t *testing.T) {
	const ep = "10.1.0.2:8000"
	f := centralFixture(t, Config{}, ep)
	for range 3 {
		c, err := net.Dial("tcp", f.sub.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
	reach(t, f, realPublisher(t, f, ep), ep, 1, reachDeadline)
}

// H3: one silent TCP peer held the handshake, and so every new publisher.
func TestSilentPeerDoesNotBlockPublishers(t *testing.T) {
	const ep = "10.1.0.3:8000"
	f := centralFixture(t, Config{}, ep)
	silent := dialRaw(t, f)
	greet := dialRaw(t, f) // sends half a greeting and stops
	if _, err := greet.Write(greeting()[:5]); err != nil {
		t.Fatal(err)
	}
	reach(t, f, realPublisher(t, f, ep), ep, 1, reachDeadline)
	_ = silent
}

// A hundred hostile peers at once, of every kind, and one real publisher:
// its events arrive; the peers that misbehave are disconnected.
func TestHundredHostilePeers(t *testing.T) {
	const ep = "10.1.0.4:8000"
	f := centralFixture(t, Config{}, ep)
	attacks := [][]byte{
		nil,                              // silent
		greeting()[:10],                  // half a greeting
		[]byte("GET / HTTP/1.1\r\n\r\n"), // not ZMTP
		append(greeting(), longFrame(0x04, 1<<62)...),
		append(append(greeting(), readyPUB()...), longFrame(0, 1<<40)...),
		append(append(greeting(), readyPUB()...), 0x01, 0x08), // a frame, then silence
		append(greeting(), 0x04, 0x03, 0x05, 'X', 'Y'),        // truncated command
	}
	var wg sync.WaitGroup
	for i := range 100 {
		c := dialRaw(t, f)
		if a := attacks[i%len(attacks)]; a != nil {
			wg.Go(func() { _, _ = c.Write(a) })
		}
	}
	wg.Wait()
	reach(t, f, realPublisher(t, f, ep), ep, 1, reachDeadline)
}

// A forged stream for an endpoint whose publisher is connected (a restart
// claim, a jump, an AllBlocksCleared) cannot wipe its entries.
func TestForgedSequenceCannotWipe(t *testing.T) {
	const ep = "10.1.0.5:8000"
	f := centralFixture(t, Config{}, ep)
	pub := realPublisher(t, f, ep)
	reach(t, f, pub, ep, 1, testTimeout)

	forger := newRawPub(t, kvwire.BuildTopic(ep, "m"), "tcp://"+f.sub.Addr().String())
	f.eventually("the forger's subscription", forger.subscribed)
	clearAll := kvwire.EventBatch{TS: 1, Events: []kvwire.Event{kvwire.AllBlocksCleared{}}}
	forger.sendBatch(0, clearAll)     // "restarted"
	forger.sendBatch(1<<40, clearAll) // "lost messages"
	// Every copy of block 1 that reach stored, should this one apply.
	forger.sendBatch(1<<40+1, removed("", slices.Repeat([]uint64{1}, 1024)...))
	conflicting := f.sub.m.dropped.WithLabelValues(dropConflictingStream)
	f.eventually("the forged messages", func() bool {
		return testutil.ToFloat64(conflicting) >= 3 || f.holds(ep, 1) == 0
	})
	if f.holds(ep, 1) != 1 {
		t.Fatal("a forged stream wiped the publisher's entries")
	}
	reach(t, f, pub, ep, 2, reachDeadline)
	if got := testutil.ToFloat64(f.sub.m.restarts) + testutil.ToFloat64(f.sub.m.gaps); got != 0 {
		t.Fatalf("restarts+gaps = %v after forged claims, want 0", got)
	}
}

// A flood of large batches from several connections, applied more slowly
// than they arrive: the bytes held stay within the budget (connections
// over it are dropped), and a real publisher still gets through.
func TestFloodMemoryBounded(t *testing.T) {
	const ep = "10.1.0.6:8000"
	const budgetBytes = 2 << 20
	// The index holds the flood's 80k entries without evicting the real
	// publisher's.
	f := newFixtureSized(t, Config{
		Bind: "tcp://127.0.0.1:0", MemoryBudget: budgetBytes, PublisherMemory: 1 << 20, MaxMessageSize: 256 << 10,
		PublisherRate: -1, PublisherBytes: -1,
	}, 1<<20)
	f.sub.AddEndpoint(ep, Source{})
	flooded := make([]string, 4)
	for i := range flooded {
		flooded[i] = "10.1.1." + string(rune('1'+i)) + ":8000"
		f.sub.AddEndpoint(flooded[i], Source{})
	}
	// 20k hashes: about 180 KB encoded, and slow to apply.
	hs := make([]uint64, 20_000)
	for i := range hs {
		hs[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	payload, err := kvwire.Encode(stored("", hs...), kvwire.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc

	stop := make(chan struct{})
	var peakHeld int64
	var peakHeap uint64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			peakHeld = max(peakHeld, f.sub.mem.used.Load())
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapAlloc)
		}
	}()
	var wg sync.WaitGroup
	var flooders []*rawPub
	for _, fep := range flooded {
		p := newRawPub(t, kvwire.BuildTopic(fep, "m"), "tcp://"+f.sub.Addr().String())
		flooders = append(flooders, p)
		f.eventually("a flooder's subscription", p.subscribed)
		wg.Go(func() {
			for seq := range uint64(200) {
				p.send(seq, payload)
				time.Sleep(time.Millisecond)
			}
		})
	}
	// The real publisher starts while the flood is on.
	reach(t, f, realPublisher(t, f, ep), ep, 1, testTimeout)
	wg.Wait()
	for _, p := range flooders {
		p.close()
	}
	close(stop)
	<-sampled
	if peakHeld > budgetBytes {
		t.Fatalf("held %d bytes, budget %d", peakHeld, budgetBytes)
	}
	// About 145 MB were sent; the heap may hold the budget, the floors,
	// the index, the connections' buffers and garbage not yet collected,
	// not the flood.
	if grew := int64(peakHeap) - int64(base); grew > 64<<20 {
		t.Fatalf("heap grew by %d MiB during the flood", grew>>20)
	}
	t.Logf("peak held %d KiB (budget %d KiB), heap growth %d MiB; closed for memory: %v",
		peakHeld>>10, budgetBytes>>10, (int64(peakHeap)-int64(base))>>20,
		testutil.ToFloat64(f.sub.m.closed.WithLabelValues("memory")))
}

// The default admission rule: loopback, or the IP of a pool endpoint, and
// a topic only for an endpoint with the peer's own IP.
func TestAuthorizeDefaultRule(t *testing.T) {
	f := newFixture(t, Config{})
	f.sub.AddEndpoint("10.2.0.1:8000", Source{})
	f.sub.AddEndpoint("10.2.0.1:8001", Source{})
	addr := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000} }
	for _, tc := range []struct {
		remote, endpoint string
		want             bool
	}{
		{"10.2.0.1", "", true},
		{"10.2.0.9", "", false},
		{"127.0.0.1", "", true},
		{"::1", "10.2.0.1:8000", true},
		{"10.2.0.1", "10.2.0.1:8001", true},
		{"10.2.0.1", "10.2.0.2:8000", false},
		{"::ffff:10.2.0.1", "10.2.0.1:8000", true},
	} {
		if got := f.sub.authorized(addr(tc.remote), tc.endpoint); got != tc.want {
			t.Errorf("authorized(%s, %q) = %v", tc.remote, tc.endpoint, got)
		}
	}
	f.sub.EndpointRemoved("10.2.0.1:8000")
	if !f.sub.authorized(addr("10.2.0.1"), "") {
		t.Error("the IP still has an endpoint")
	}
	f.sub.EndpointRemoved("10.2.0.1:8001")
	if f.sub.authorized(addr("10.2.0.1"), "") {
		t.Error("an IP with no endpoint left is admitted")
	}
}

// TrustedNets admit their peers as loopback is, for any endpoint, and
// leave the rule as it was for everyone else.
func TestAuthorizeTrustedNets(t *testing.T) {
	f := newFixture(t, Config{TrustedNets: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16"), netip.MustParsePrefix("fd00:1::/64")}})
	f.sub.AddEndpoint("10.2.0.1:8000", Source{})
	addr := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000} }
	for _, tc := range []struct {
		remote, endpoint string
		want             bool
	}{
		{"10.9.3.4", "", true},
		{"10.9.3.4", "10.2.0.1:8000", true},
		{"::ffff:10.9.3.4", "10.7.0.1:8000", true},
		{"fd00:1::5", "10.2.0.1:8000", true},
		{"10.10.0.1", "", false},
		{"10.2.0.1", "10.2.0.1:8000", true},
		{"10.2.0.1", "10.9.0.1:8000", false},
	} {
		if got := f.sub.authorized(addr(tc.remote), tc.endpoint); got != tc.want {
			t.Errorf("authorized(%s, %q) = %v", tc.remote, tc.endpoint, got)
		}
	}
}

// A publisher that restarts and has already sent more batches than the
// old one when the subscriber hears from it (the slow joiner's jump) is a
// restart, not a gap of the old stream: the old entries go, and the new
// publisher's start is replayed. A reconnect of the same publisher with a
// jump is a gap, filled from its replay buffer, and keeps the entries.
func TestRestartWithSlowJoinerJump(t *testing.T) {
	const ep = "10.1.0.7:8000"
	newStore := func(base uint64, n int) (*kvwire.Publisher, []kvwire.EventBatch) {
		store, err := kvwire.NewPublisher(t.Context(), kvwire.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		bs := make([]kvwire.EventBatch, n)
		for i := range bs {
			bs[i] = stored("", base+uint64(i))
			if err := store.Publish(bs[i]); err != nil {
				t.Fatal(err)
			}
		}
		return store, bs
	}
	for _, restart := range []bool{true, false} {
		t.Run(map[bool]string{true: "restart", false: "reconnect"}[restart], func(t *testing.T) {
			f := newFixture(t, Config{})
			old, oldBatches := newStore(600, 20)
			p := followed(t, f, ep, "tcp://"+old.ReplayAddr().String())
			for seq := range uint64(5) {
				p.sendBatch(seq, oldBatches[seq])
			}
			f.eventually("the first stream", func() bool { return f.holds(ep, 604) == 1 })
			store, batches := old, oldBatches
			if restart {
				store, batches = newStore(700, 20)
			}
			// A new connection (the source is replaced), on which the
			// first batch heard is number 8 or later.
			f.sub.AddEndpoint(ep, Source{Events: p.addr(), Replay: "tcp://" + store.ReplayAddr().String()})
			seq := uint64(8)
			f.eventually("the new stream", func() bool {
				if seq < 20 {
					p.sendBatch(seq, batches[seq])
					seq++
				}
				time.Sleep(10 * time.Millisecond)
				return f.holds(ep, 700+7) == 1 || f.holds(ep, 600+7) == 1
			})
			base, other := uint64(600), uint64(700)
			if restart {
				base, other = 700, 600
			}
			for i := range uint64(8) {
				if f.holds(ep, base+i) != 1 {
					t.Errorf("block %d of the current publisher missing", base+i)
				}
				if f.holds(ep, other+i) != 0 {
					t.Errorf("block %d of the previous publisher survived", other+i)
				}
			}
			if got := testutil.ToFloat64(f.sub.m.restarts); (got == 1) != restart {
				t.Errorf("restarts = %v", got)
			}
		})
	}
}

// With TLS configured the central socket takes only TLS publishers.
func TestCentralTLS(t *testing.T) {
	const ep = "10.1.0.8:8000"
	cert, pool := kvtest.SelfSignedCert(t)
	f := centralFixture(t, Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}}, ep)
	plain := realPublisher(t, f, ep)
	secure, err := kvwire.NewPublisher(t.Context(), kvwire.PublisherConfig{
		Endpoint: "tcp://" + f.sub.Addr().String(), Topic: kvwire.BuildTopic(ep, "m"), TLS: &tls.Config{RootCAs: pool},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer secure.Close()
	reach(t, f, secure, ep, 1, testTimeout)
	for range 20 {
		if err := plain.Publish(stored("", 2)); err != nil {
			t.Fatal(err)
		}
	}
	reach(t, f, secure, ep, 3, testTimeout)
	if f.holds(ep, 2) != 0 {
		t.Fatal("a plain-text publisher got through the TLS socket")
	}
	if testutil.ToFloat64(f.sub.m.rejected.WithLabelValues("handshake")) == 0 {
		t.Fatal("the plain-text publisher's handshakes were not refused")
	}
}
