package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

const testTimeout = 10 * time.Second

// byteConn is a net.Conn reading from fixed bytes and discarding writes.
type byteConn struct {
	r io.Reader
	net.Conn
}

func (c byteConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c byteConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c byteConn) Close() error                     { return nil }
func (c byteConn) SetDeadline(time.Time) error      { return nil }
func (c byteConn) SetReadDeadline(time.Time) error  { return nil }
func (c byteConn) SetWriteDeadline(time.Time) error { return nil }
func (c byteConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// connFrom is a handshaken SUB-side Conn whose peer (a PUB) sends data.
func connFrom(data []byte, lim Limits, alloc Allocator) *Conn {
	nc := byteConn{r: bytes.NewReader(data)}
	return &Conn{nc: nc, r: bufio.NewReader(nc), w: bufio.NewWriter(io.Discard), self: SUB, peer: PUB, lim: lim.withDefaults(), alloc: alloc}
}

func frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flags | flagLong}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// counting is an Allocator with a cap.
type counting struct {
	max, used atomic.Int64
}

func (a *counting) Reserve(n int) error {
	if a.used.Add(int64(n)) > a.max.Load() {
		a.used.Add(-int64(n))
		return errors.New("full")
	}
	return nil
}
func (a *counting) Release(n int) { a.used.Add(-int64(n)) }

func TestRecvLimits(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 300_000)
	for _, tc := range []struct {
		name   string
		data   []byte
		lim    Limits
		frames int   // of the first message, when it is accepted
		err    error // of the first Recv otherwise
	}{
		{"three frames", cat(frame(flagMore, []byte("t")), frame(flagMore, make([]byte, 8)), frame(0, big)), Limits{}, 3, nil},
		{"huge declared frame", cat(frame(flagMore, []byte("t")), binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<62)), Limits{}, 0, ErrTooLarge},
		{"2^64-1", binary.BigEndian.AppendUint64([]byte{flagLong | flagMore}, ^uint64(0)), Limits{}, 0, ErrTooLarge},
		{"sum over the limit", cat(frame(flagMore, big), frame(0, big)), Limits{MaxMessageSize: 500_000}, 0, ErrTooLarge},
		{"too many frames", cat(frame(flagMore, nil), frame(flagMore, nil), frame(0, nil)), Limits{MaxFrames: 2}, 0, ErrTooLarge},
		{"huge command", binary.BigEndian.AppendUint64([]byte{flagLong | flagCommand}, 1<<20), Limits{}, 0, ErrTooLarge},
		{"command inside a message", cat(frame(flagMore, []byte("a")), frame(flagCommand, []byte("\x04PING\x00\x00"))), Limits{}, 0, ErrProtocol},
		{"bad flags", []byte{0x80, 0}, Limits{}, 0, ErrProtocol},
		{"truncated", cat(frame(flagMore, []byte("t")), []byte{0, 5, 1}), Limits{}, 0, io.ErrUnexpectedEOF},
		{"PING answered, then a message", cat(frame(flagCommand, []byte("\x04PING\x00\x10ctx")), frame(0, []byte("m"))), Limits{}, 1, nil},
		{"unknown command skipped", cat(frame(flagCommand, []byte("\x05HELLOxyz")), frame(0, []byte("m"))), Limits{}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			alloc := &counting{}
			alloc.max.Store(1 << 30)
			m, err := connFrom(tc.data, tc.lim, alloc).Recv()
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("Recv = %v, want %v", err, tc.err)
				}
				if alloc.used.Load() != 0 {
					t.Fatalf("%d bytes still reserved after a failed read", alloc.used.Load())
				}
				return
			}
			if err != nil || len(m.Frames) != tc.frames {
				t.Fatalf("Recv = %d frames, %v; want %d", len(m.Frames), err, tc.frames)
			}
			if int64(m.Reserved) != alloc.used.Load() || m.Reserved < len(m.Frames[len(m.Frames)-1]) {
				t.Fatalf("reserved %d, allocator holds %d", m.Reserved, alloc.used.Load())
			}
		})
	}
}

// A declared size costs nothing until its bytes arrive, and the
// allocator can refuse them.
func TestRecvAllocatesAsBytesArrive(t *testing.T) {
	alloc := &counting{}
	alloc.max.Store(1 << 20)
	data := cat(binary.BigEndian.AppendUint64([]byte{flagLong}, 8<<20), make([]byte, 100))
	_, err := connFrom(data, Limits{MaxMessageSize: 16 << 20}, alloc).Recv()
	if !errors.Is(err, io.ErrUnexpectedEOF) || alloc.used.Load() != 0 {
		t.Fatalf("Recv = %v, %d bytes reserved", err, alloc.used.Load())
	}
	data = cat(binary.BigEndian.AppendUint64([]byte{flagLong}, 4<<20), make([]byte, 4<<20))
	if _, err := connFrom(data, Limits{}, alloc).Recv(); !errors.Is(err, ErrBudget) {
		t.Fatalf("Recv over the allocator's cap = %v, want ErrBudget", err)
	}
	if alloc.used.Load() != 0 {
		t.Fatalf("%d bytes reserved after a refused read", alloc.used.Load())
	}
}

func TestSubscriptionForms(t *testing.T) {
	nc := byteConn{r: bytes.NewReader(cat(
		frame(0, []byte("\x01kv@")), frame(0, []byte("\x00kv@")),
		frame(flagCommand, []byte("\x09SUBSCRIBEab")), frame(flagCommand, []byte("\x06CANCELab")),
	))}
	c := &Conn{nc: nc, r: bufio.NewReader(nc), w: bufio.NewWriter(io.Discard), self: PUB, peer: SUB, lim: Limits{}.withDefaults()}
	for _, want := range []struct {
		sub   bool
		topic string
	}{{true, "kv@"}, {false, "kv@"}, {true, "ab"}, {false, "ab"}} {
		m, err := c.Recv()
		if err != nil || m.Subscribe != want.sub || m.Cancel == want.sub || string(m.Topic) != want.topic {
			t.Fatalf("Recv = %+v, %v; want subscribe=%v %q", m, err, want.sub, want.topic)
		}
	}
}

// pipePair handshakes the two ends of a loopback TCP connection.
func pipePair(t *testing.T, a, b HandshakeConfig) (*Conn, *Conn, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			ch <- res{nil, err}
			return
		}
		c, err := Handshake(nc, b, time.Now().Add(testTimeout))
		if err != nil {
			nc.Close()
		}
		ch <- res{c, err}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ca, errA := Handshake(nc, a, time.Now().Add(testTimeout))
	if errA != nil {
		nc.Close()
	}
	r := <-ch
	if ca != nil {
		t.Cleanup(func() { ca.Close() })
	}
	if r.c != nil {
		t.Cleanup(func() { r.c.Close() })
	}
	return ca, r.c, errors.Join(errA, r.err)
}

func TestHandshakeTypes(t *testing.T) {
	for _, tc := range []struct {
		a, b Type
		ok   bool
	}{{PUB, SUB, true}, {SUB, PUB, true}, {DEALER, ROUTER, true}, {PUB, PUB, false}, {SUB, DEALER, false}} {
		c, _, err := pipePair(t, HandshakeConfig{Type: tc.a, Identity: []byte("id")}, HandshakeConfig{Type: tc.b})
		if (err == nil) != tc.ok {
			t.Errorf("%s-%s: %v", tc.a, tc.b, err)
		}
		if err == nil && c.PeerType() != tc.b {
			t.Errorf("%s-%s: peer type %q", tc.a, tc.b, c.PeerType())
		}
		if tc.ok && !errors.Is(err, nil) {
			t.Errorf("%s-%s: %v", tc.a, tc.b, err)
		}
	}
	// A DEALER's identity reaches the ROUTER.
	_, r, err := pipePair(t, HandshakeConfig{Type: DEALER, Identity: []byte("me")}, HandshakeConfig{Type: ROUTER})
	if err != nil || string(r.PeerIdentity()) != "me" {
		t.Fatalf("identity %q, %v", r.PeerIdentity(), err)
	}
}

func TestHandshakeRejectsNonZMTP(t *testing.T) {
	for name, data := range map[string][]byte{
		"http":     []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 64))),
		"zmtp 2":   append([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 1}, make([]byte, 60)...),
		"curve":    cat([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 1}, []byte("CURVE"), make([]byte, 47)),
		"no ready": cat(greetingBytes(), frame(0, []byte("msg"))),
		"empty":    nil,
	} {
		if _, err := Handshake(byteConn{r: bytes.NewReader(data)}, HandshakeConfig{Type: SUB}, time.Now().Add(time.Second)); err == nil {
			t.Errorf("%s: handshake accepted", name)
		}
	}
}

func greetingBytes() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 1
	copy(g[12:], "NULL")
	return g
}

// FuzzRecv feeds arbitrary bytes to a connection's reader: no panic, no
// message beyond the limits, nothing left reserved after an error.
func FuzzRecv(f *testing.F) {
	f.Add(cat(frame(flagMore, []byte("topic")), frame(flagMore, make([]byte, 8)), frame(0, []byte("payload"))))
	f.Add(binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<62))
	f.Add(cat(frame(flagCommand, []byte("\x04PING\x00\x01")), frame(0, nil)))
	f.Add(frame(flagCommand, []byte("\x09SUBSCRIBE")))
	f.Add([]byte{flagMore, 0, flagMore | flagLong, 0, 0, 0, 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		alloc := &counting{}
		alloc.max.Store(1 << 20)
		lim := Limits{MaxMessageSize: 64 << 10, MaxFrames: 4}
		for _, peer := range []Type{PUB, SUB} {
			c := connFrom(data, lim, alloc)
			c.peer = peer
			for {
				m, err := c.Recv()
				if err != nil {
					if alloc.used.Load() != 0 {
						t.Fatalf("%d bytes reserved after %v", alloc.used.Load(), err)
					}
					break
				}
				size := 0
				for _, fr := range m.Frames {
					size += len(fr)
				}
				if int64(size) > lim.MaxMessageSize || len(m.Frames) > lim.MaxFrames {
					t.Fatalf("message of %d bytes, %d frames beyond the limits", size, len(m.Frames))
				}
				alloc.Release(m.Reserved)
			}
		}
	})
}

// FuzzHandshake: no input makes the handshake panic.
func FuzzHandshake(f *testing.F) {
	f.Add(cat(greetingBytes(), frame(flagCommand, append([]byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03"), "PUB"...))))
	f.Add(cat(greetingBytes(), binary.BigEndian.AppendUint64([]byte{flagCommand | flagLong}, 1<<62)))
	f.Add(cat(greetingBytes(), frame(flagCommand, []byte("\x05READY\x0bSocket-Type\xff\xff\xff\xff"))))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = Handshake(byteConn{r: bytes.NewReader(data)}, HandshakeConfig{Type: SUB}, time.Now().Add(time.Second))
	})
}

// A Server handshakes off its accept loop: silent peers time out, the cap
// turns the rest away, Admit is asked first, and a real peer gets through
// while they are connected.
func TestServerBounds(t *testing.T) {
	var rejected struct{ admission, maxConns, handshake atomic.Int32 }
	var served atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := Listen(ctx, "tcp://127.0.0.1:0", ServerConfig{
		HandshakeConfig: HandshakeConfig{Type: SUB},
		// Until it fires the silent peers hold their slots: the real
		// peer's handshake and the sixth connection must come within it,
		// on a loaded machine too.
		HandshakeTimeout: 2 * time.Second,
		MaxConns:         5,
		Admit:            func(a net.Addr) bool { return a.(*net.TCPAddr).IP.IsLoopback() },
		Rejected: func(r string) {
			switch r {
			case "admission":
				rejected.admission.Add(1)
			case "max_conns":
				rejected.maxConns.Add(1)
			case "handshake":
				rejected.handshake.Add(1)
			}
		},
	}, func(ctx context.Context, c *Conn) {
		served.Add(1)
		<-ctx.Done()
	})
	if err != nil {
		t.Fatal(err)
	}
	var silent []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	// The fifth slot is left for a real peer; a sixth connection is refused.
	pub, err := Dial(ctx, "tcp://"+srv.Addr().String(), DialConfig{HandshakeConfig: HandshakeConfig{Type: PUB}})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	extra, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	extra.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := extra.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection beyond MaxConns was served")
	}
	// The silent ones time out.
	for _, c := range silent {
		c.SetReadDeadline(time.Now().Add(testTimeout))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("a silent peer was not disconnected: %v", err)
		}
	}
	if served.Load() != 1 || rejected.handshake.Load() != 4 || rejected.maxConns.Load() < 1 {
		t.Fatalf("served %d, handshake failures %d, over the cap %d", served.Load(), rejected.handshake.Load(), rejected.maxConns.Load())
	}
	cancel()
	srv.Close()
}

func TestServerClosesEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	srv, err := Listen(context.Background(), "tcp://127.0.0.1:0", ServerConfig{HandshakeConfig: HandshakeConfig{Type: PUB}},
		NewPub(PubConfig{}).Serve)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(context.Background(), "tcp://"+srv.Addr().String(), DialConfig{HandshakeConfig: HandshakeConfig{Type: SUB}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.Close()
	c.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := c.Recv(); err == nil {
		t.Fatal("connection still open after Close")
	}
	testutil.NoGoroutineLeak(t, before, "Server.Close")
}

// A subscriber that stops reading loses messages, then is disconnected;
// Send never blocks and another subscriber keeps receiving.
func TestPubSlowSubscriber(t *testing.T) {
	// The write timeout must not fire for the subscriber that reads, which
	// a loaded machine may leave unscheduled for a while.
	pub := NewPub(PubConfig{SendQueue: 8, WriteTimeout: time.Second})
	srv, err := Listen(t.Context(), "tcp://127.0.0.1:0", ServerConfig{HandshakeConfig: HandshakeConfig{Type: PUB}}, pub.Serve)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dial := func() *Conn {
		c, err := Dial(t.Context(), "tcp://"+srv.Addr().String(), DialConfig{HandshakeConfig: HandshakeConfig{Type: SUB}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.SendSubscribe(time.Time{}, nil); err != nil {
			t.Fatal(err)
		}
		return c
	}
	stalled, reader := dial(), dial()
	_ = stalled
	for deadline := time.Now().Add(testTimeout); pub.Subscribers() < 2; {
		if time.Now().After(deadline) {
			t.Fatal("subscriptions never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := make(chan int, 1<<16)
	go func() {
		for {
			m, err := reader.Recv()
			if err != nil {
				close(got)
				return
			}
			got <- len(m.Frames)
		}
	}()
	payload := make([]byte, 256<<10)
	deadline := time.Now().Add(testTimeout)
	for pub.Stats().Disconnected == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the stalled subscriber was never disconnected: %+v", pub.Stats())
		}
		pub.Send([]byte("t"), payload)
		time.Sleep(time.Millisecond)
	}
	if pub.Stats().Dropped == 0 {
		t.Fatal("no message was dropped for the stalled subscriber")
	}
	pub.Send([]byte("t"), []byte("after"))
	n := 0
	for range got {
		if n++; len(got) == 0 && pub.Subscribers() == 1 {
			break
		}
	}
	if n == 0 || pub.Subscribers() != 1 {
		t.Fatalf("the reading subscriber got %d messages; %d subscribers left", n, pub.Subscribers())
	}
}

func TestTLS(t *testing.T) {
	cert, pool := testutil.SelfSignedCert(t)
	msgs := make(chan Msg, 1)
	srv, err := Listen(t.Context(), "tcp://127.0.0.1:0", ServerConfig{
		HandshakeConfig: HandshakeConfig{Type: SUB},
		TLS:             &tls.Config{Certificates: []tls.Certificate{cert}},
	}, func(ctx context.Context, c *Conn) {
		m, err := c.Recv()
		if err == nil {
			msgs <- m
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// Plain ZMTP is refused by a TLS server.
	if _, err := Dial(t.Context(), "tcp://"+srv.Addr().String(), DialConfig{HandshakeConfig: HandshakeConfig{Type: PUB}, HandshakeTimeout: time.Second}); err == nil {
		t.Fatal("a plain connection was accepted by the TLS server")
	}
	c, err := Dial(t.Context(), "tcp://"+srv.Addr().String(), DialConfig{
		HandshakeConfig: HandshakeConfig{Type: PUB}, TLS: &tls.Config{RootCAs: pool},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Send(time.Now().Add(testTimeout), []byte("over"), []byte("tls")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		if len(m.Frames) != 2 || string(m.Frames[1]) != "tls" {
			t.Fatalf("frames %q", m.Frames)
		}
	case <-time.After(testTimeout):
		t.Fatal("nothing arrived over TLS")
	}
}

func TestParseEndpoint(t *testing.T) {
	for ep, want := range map[string]string{
		"tcp://*:5557": "tcp :5557", "tcp://127.0.0.1:*": "tcp 127.0.0.1:0", "tcp://[::]:5557": "tcp [::]:5557",
		"ipc:///tmp/kv": "unix /tmp/kv", "inproc://x": "", "5557": "", "tcp://nohost": "",
	} {
		n, a, err := ParseEndpoint(ep)
		if got := n + " " + a; (err != nil) != (want == "") || (err == nil && got != want) {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q", ep, got, err, want)
		}
	}
}
