package kvwire

import (
	"context"
	"encoding/binary"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp"
	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

// testTimeout bounds waits for the network so a broken test fails rather
// than hangs; nothing asserts how long anything takes.
const testTimeout = 10 * time.Second

func batchN(i int) EventBatch {
	return EventBatch{TS: float64(i), Events: []Event{
		BlockStored{BlockHashes: []Hash{Uint64Hash(uint64(i))}, TokenIDs: []int{i}, BlockSize: 16, Medium: MediumGPU},
	}}
}

// testSub is a SUB side fed by one or more connections.
type testSub struct {
	msgs chan zmtp.Msg
}

func newTestSub() *testSub { return &testSub{msgs: make(chan zmtp.Msg, 1024)} }

// serve subscribes to everything on a connection and forwards its messages.
func (s *testSub) serve(ctx context.Context, c *zmtp.Conn) { zmtptest.Subscriber(s.msgs, 0)(ctx, c) }

// redial subscribes to p's PUB socket through zmtp.Redial in the
// background; the returned func ends that and waits for it.
func (s *testSub) redial(ctx context.Context, p *Publisher) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		zmtp.Redial(ctx, "tcp://"+p.Addr().String(), zmtp.DialConfig{HandshakeConfig: zmtp.HandshakeConfig{Type: zmtp.SUB}}, s.serve)
	}()
	return func() { cancel(); <-done }
}

// recvTimeout receives from s or fails the test after testTimeout.
func recvTimeout(t *testing.T, msgs <-chan zmtp.Msg) zmtp.Msg {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(testTimeout):
		t.Fatal("timed out waiting for a message")
	}
	return zmtp.Msg{}
}

// syncSub publishes until sub receives, beating the slow-joiner loss, and
// returns the first sequence number received.
func syncSub(t *testing.T, p *Publisher, sub *testSub) uint64 {
	t.Helper()
	deadline := time.After(testTimeout)
	for {
		if err := p.Publish(batchN(-1)); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-sub.msgs:
			return binary.BigEndian.Uint64(m.Frames[1])
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatal("subscriber never received")
		}
	}
}

func TestPublisherFraming(t *testing.T) {
	for _, tc := range []struct {
		name    string
		enc     Encoding
		connect bool // the publisher connects to a bound SUB
	}{
		{"bind array", EncodingArray, false},
		{"bind map", EncodingMap, false},
		{"connect array", EncodingArray, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			sub := newTestSub()
			cfg := PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Topic: "kv@10.0.0.1:8000@m", Encoding: tc.enc}
			if tc.connect {
				srv, err := zmtp.Listen(ctx, "tcp://127.0.0.1:*", zmtp.ServerConfig{HandshakeConfig: zmtp.HandshakeConfig{Type: zmtp.SUB}}, sub.serve)
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				cfg.Endpoint = "tcp://" + srv.Addr().String()
			}
			p, err := NewPublisher(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if !tc.connect {
				defer sub.redial(ctx, p)()
			}
			last := syncSub(t, p, sub)
			// Drain what the sync loop sent after the first one arrived.
			for p.Stats().Published > last+1 {
				m := recvTimeout(t, sub.msgs)
				last = binary.BigEndian.Uint64(m.Frames[1])
			}
			for i := range 5 {
				if err := p.Publish(batchN(i)); err != nil {
					t.Fatal(err)
				}
				m := recvTimeout(t, sub.msgs)
				if len(m.Frames) != 3 || string(m.Frames[0]) != cfg.Topic || len(m.Frames[1]) != 8 {
					t.Fatalf("frames %q", m.Frames)
				}
				if seq := binary.BigEndian.Uint64(m.Frames[1]); seq != last+1 {
					t.Fatalf("seq %d after %d", seq, last)
				}
				last++
				want, _ := Encode(batchN(i), tc.enc)
				if !reflect.DeepEqual(m.Frames[2], want) {
					t.Fatalf("payload %x, want %x", m.Frames[2], want)
				}
			}
		})
	}
}

func TestPublisherReplay(t *testing.T) {
	ctx := t.Context()
	p, err := NewPublisher(ctx, PublisherConfig{
		Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", ReplaySize: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 6 {
		if err := p.Publish(batchN(i)); err != nil {
			t.Fatal(err)
		}
	}
	dealer, err := zmtp.Dial(ctx, "tcp://"+p.ReplayAddr().String(), zmtp.DialConfig{HandshakeConfig: zmtp.HandshakeConfig{Type: zmtp.DEALER}})
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	for _, tc := range []struct {
		start uint64
		want  []uint64 // the ring holds the last 4 of seq 0..5
	}{
		{0, []uint64{2, 3, 4, 5}},
		{4, []uint64{4, 5}},
		{9, nil},
	} {
		if err := dealer.Send(time.Time{}, []byte{}, seqBytes(tc.start)); err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for {
			if err := dealer.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
				t.Fatal(err)
			}
			m, err := dealer.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 8 {
				t.Fatalf("replay frames %q", m.Frames)
			}
			seq := binary.BigEndian.Uint64(m.Frames[1])
			if seq == ReplayEnd {
				if len(m.Frames[2]) != 0 {
					t.Fatalf("end marker with payload %x", m.Frames[2])
				}
				break
			}
			b, _, err := Decode(m.Frames[2])
			if err != nil || b.TS != float64(seq) {
				t.Fatalf("replayed seq %d: batch %+v, %v", seq, b, err)
			}
			got = append(got, seq)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("replay from %d = %v, want %v", tc.start, got, tc.want)
		}
	}
	if st := p.Stats(); st.Published != 6 || st.Replays != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPublisherClosed(t *testing.T) {
	p, err := NewPublisher(t.Context(), PublisherConfig{Endpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(batchN(0)); err != ErrClosed {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestBinds(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://*:5557": true, "tcp://127.0.0.1:*": true, "tcp://[::]:5557": true, "ipc:///tmp/kv": true,
		"tcp://10.0.0.5:5557": false, "tcp://picker.ns.svc:5557": false,
	} {
		if Binds(ep) != want {
			t.Errorf("Binds(%q) = %v", ep, !want)
		}
	}
}

// TestPublisherStalledSubscriber: a subscriber that stops reading (as a
// hung or hostile peer does) neither blocks Publish nor starves another
// subscriber; it is disconnected.
func TestPublisherStalledSubscriber(t *testing.T) {
	ctx := t.Context()
	// The write timeout must not fire for the subscriber that reads, which
	// a loaded machine may leave unscheduled for a while.
	p, err := NewPublisher(ctx, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", QueueSize: 16, WriteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	stalled, err := zmtp.Dial(ctx, "tcp://"+p.Addr().String(), zmtp.DialConfig{HandshakeConfig: zmtp.HandshakeConfig{Type: zmtp.SUB}})
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if err := stalled.SendSubscribe(time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	sub := newTestSub()
	defer sub.redial(ctx, p)()
	for deadline := time.Now().Add(testTimeout); p.Subscribers() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("subscriptions never arrived")
		}
	}
	// About 180 KB per batch: the stalled connection's socket buffers fill
	// after some tens of them.
	hs := make([]Hash, 20_000)
	for i := range hs {
		hs[i] = Uint64Hash(uint64(i) * 0x9e3779b97f4a7c15)
	}
	big := EventBatch{TS: 1, Events: []Event{BlockStored{BlockHashes: hs, BlockSize: 16}}}
	received, afterDisconnect := 0, 0
	deadline := time.Now().Add(testTimeout)
	for afterDisconnect < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("received %d, %d after the disconnect; stats %+v", received, afterDisconnect, p.Stats())
		}
		if err := p.Publish(big); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sub.msgs:
			received++
			if p.Stats().Disconnected > 0 {
				afterDisconnect++
			}
		case <-time.After(2 * time.Millisecond):
		}
	}
	// Whether its queue filled (Dropped) before the write timed out
	// depends on the machine's speed; the disconnect does not.
	if st := p.Stats(); st.Disconnected != 1 || p.Subscribers() != 1 {
		t.Fatalf("stats %+v, %d subscribers", st, p.Subscribers())
	}
}

// TestPublisherSurvivesHostilePeers: probes, silent peers and huge frame
// declarations on the publisher's PUB and replay sockets leave both
// serving.
func TestPublisherSurvivesHostilePeers(t *testing.T) {
	ctx := t.Context()
	p, err := NewPublisher(ctx, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	huge := append(greeting, binary.BigEndian.AppendUint64([]byte{0x06}, 1<<62)...)
	for _, addr := range []string{p.Addr().String(), p.ReplayAddr().String()} {
		for _, attack := range [][]byte{nil, greeting[:7], huge} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			if attack == nil {
				_ = c.Close() // a port probe
				continue
			}
			defer c.Close() // silent from here on
			if _, err := c.Write(attack); err != nil {
				t.Fatal(err)
			}
		}
	}
	sub := newTestSub()
	defer sub.redial(ctx, p)()
	syncSub(t, p, sub)
	dealer, err := zmtp.Dial(ctx, "tcp://"+p.ReplayAddr().String(), zmtp.DialConfig{HandshakeConfig: zmtp.HandshakeConfig{Type: zmtp.DEALER}})
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	if err := dealer.Send(time.Now().Add(testTimeout), []byte{}, seqBytes(0)); err != nil {
		t.Fatal(err)
	}
	if err := dealer.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	if m, err := dealer.Recv(); err != nil || len(m.Frames) != 3 {
		t.Fatalf("replay after the attacks: %v, %v", m.Frames, err)
	}
}
