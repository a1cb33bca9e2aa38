package zmtp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp"
	"github.com/kvgate/kvgate/internal/zmtp/libzmqtest"
	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

// Interoperability with the real libzmq, in both directions and both
// bind/connect roles, as vLLM's publisher and replay socket use it.

const timeout = 20 * time.Second

// pattern is zpub's payload of size bytes for seq.
func pattern(seq uint64, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte((uint64(i)*7 + seq) & 0xff)
	}
	return b
}

// checkStream reads n messages of libzmq's PUB from msgs and checks their
// framing, consecutive sequence numbers and payloads.
func checkStream(t *testing.T, msgs <-chan zmtp.Msg, topic string, size, n int) {
	t.Helper()
	var last uint64
	for i := range n {
		var m zmtp.Msg
		select {
		case m = <-msgs:
		case <-time.After(timeout):
			t.Fatal("timed out waiting for libzmq's messages")
		}
		if len(m.Frames) != 3 || string(m.Frames[0]) != topic || len(m.Frames[1]) != 8 {
			t.Fatalf("message %d: %d frames %q", i, len(m.Frames), m.Frames[0])
		}
		seq := binary.BigEndian.Uint64(m.Frames[1])
		if i > 0 && seq != last+1 {
			t.Fatalf("seq %d after %d", seq, last)
		}
		last = seq
		if !bytes.Equal(m.Frames[2], pattern(seq, size)) {
			t.Fatalf("seq %d: payload of %d bytes differs", seq, len(m.Frames[2]))
		}
	}
}

var subCfg = zmtp.HandshakeConfig{Type: zmtp.SUB}

func TestLibzmqPublisher(t *testing.T) {
	bin := libzmqtest.Build(t, "zpub")
	for _, size := range []int{100, 300_000} {
		t.Run(fmt.Sprintf("libzmq binds, %d bytes", size), func(t *testing.T) {
			p := libzmqtest.Start(t, bin, "bind", "tcp://127.0.0.1:*", "kv@10.0.0.1:8000@m", "100000", fmt.Sprint(size))
			ep := p.Line(t, timeout)
			msgs := make(chan zmtp.Msg, 16)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				zmtp.Redial(ctx, ep, zmtp.DialConfig{HandshakeConfig: subCfg}, zmtptest.Subscriber(msgs, timeout))
			}()
			defer func() { cancel(); <-done }()
			checkStream(t, msgs, "kv@10.0.0.1:8000@m", size, 20)
		})
		t.Run(fmt.Sprintf("libzmq connects, %d bytes", size), func(t *testing.T) {
			msgs := make(chan zmtp.Msg, 16)
			srv, err := zmtp.Listen(t.Context(), "tcp://127.0.0.1:0", zmtp.ServerConfig{HandshakeConfig: subCfg}, zmtptest.Subscriber(msgs, timeout))
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			libzmqtest.Start(t, bin, "connect", "tcp://"+srv.Addr().String(), "", "100000", fmt.Sprint(size))
			checkStream(t, msgs, "", size, 20)
		})
	}
}

// TestLibzmqSubscriber runs libzmq's SUB, heartbeating (it drops a peer
// that does not answer its PINGs within 200 ms), against a Pub.
func TestLibzmqSubscriber(t *testing.T) {
	bin := libzmqtest.Build(t, "zsub")
	for _, bind := range []bool{false, true} {
		t.Run(fmt.Sprintf("libzmq binds %v", bind), func(t *testing.T) {
			pub := zmtp.NewPub(zmtp.PubConfig{})
			var conns atomic.Int32
			serve := func(ctx context.Context, c *zmtp.Conn) {
				conns.Add(1)
				pub.Serve(ctx, c)
			}
			const n = 30
			var p *libzmqtest.Proc
			pubCfg := zmtp.HandshakeConfig{Type: zmtp.PUB}
			if bind {
				p = libzmqtest.Start(t, bin, "bind", "tcp://127.0.0.1:*", fmt.Sprint(n))
				ep := p.Line(t, timeout)
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan struct{})
				go func() {
					defer close(done)
					zmtp.Redial(ctx, ep, zmtp.DialConfig{HandshakeConfig: pubCfg}, serve)
				}()
				defer func() { cancel(); <-done }()
			} else {
				srv, err := zmtp.Listen(t.Context(), "tcp://127.0.0.1:0", zmtp.ServerConfig{HandshakeConfig: pubCfg}, serve)
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				p = libzmqtest.Start(t, bin, "connect", "tcp://"+srv.Addr().String(), fmt.Sprint(n))
			}
			deadline := time.Now().Add(timeout)
			for pub.Subscribers() == 0 {
				if time.Now().After(deadline) {
					t.Fatal("libzmq never subscribed")
				}
				time.Sleep(5 * time.Millisecond)
			}
			topic := []byte("kv@10.0.0.2:8000@m")
			small, large := pattern(1, 50), pattern(2, 200_000)
			sum := func(b []byte) int {
				s := 0
				for _, c := range b {
					s += int(c)
				}
				return s
			}
			go func() {
				// A pause longer than the heartbeat timeout (zsub.c: 1 s)
				// midway: only the PONGs keep libzmq from dropping the
				// connection.
				for seq := range uint64(n) {
					if seq == n/2 {
						time.Sleep(1500 * time.Millisecond)
					}
					payload := small
					if seq%3 == 2 {
						payload = large
					}
					pub.Send(topic, binary.BigEndian.AppendUint64(nil, seq), payload)
					time.Sleep(15 * time.Millisecond)
				}
			}()
			for seq := range uint64(n) {
				line := p.Line(t, timeout)
				payload := small
				if seq%3 == 2 {
					payload = large
				}
				want := fmt.Sprintf("3 %d:%d 8:%d %d:%d", len(topic), sum(topic), sum(binary.BigEndian.AppendUint64(nil, seq)), len(payload), sum(payload))
				if line != want {
					t.Fatalf("message %d: libzmq read %q, want %q", seq, line, want)
				}
			}
			if err := p.Wait(timeout); err != nil {
				t.Fatalf("zsub: %v", err)
			}
			if c := conns.Load(); c != 1 {
				t.Fatalf("%d connections: libzmq dropped one (an unanswered heartbeat?)", c)
			}
		})
	}
}

// TestLibzmqReplayRouter is vLLM's replay service (a libzmq ROUTER)
// answering a DEALER.
func TestLibzmqReplayRouter(t *testing.T) {
	p := libzmqtest.Start(t, libzmqtest.Build(t, "zrouter"), "tcp://127.0.0.1:*", "2")
	ep := p.Line(t, timeout)
	c, err := zmtp.Dial(t.Context(), ep, zmtp.DialConfig{HandshakeConfig: zmtp.HandshakeConfig{Type: zmtp.DEALER}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		t.Fatal(err)
	}
	for _, from := range []uint64{7, 0} {
		if err := c.Send(time.Now().Add(timeout), nil, binary.BigEndian.AppendUint64(nil, from)); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			m, err := c.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 8 {
				t.Fatalf("reply frames %q", m.Frames)
			}
			seq := binary.BigEndian.Uint64(m.Frames[1])
			if seq == ^uint64(0) {
				break
			}
			got = append(got, fmt.Sprintf("%d=%s", seq, m.Frames[2]))
		}
		var want []string
		for s := from; s < 10; s++ {
			want = append(want, fmt.Sprintf("%d=batch-%d", s, s))
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("replay from %d: %v", from, got)
		}
	}
}
