package kvwire

import (
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// testTimeout bounds waits for the network so a broken test fails rather
// than hangs; nothing asserts how long anything takes.
const testTimeout = 10 * time.Second

func batchN(i int) EventBatch {
	return EventBatch{TS: float64(i), Events: []Event{
		BlockStored{BlockHashes: []Hash{Uint64Hash(uint64(i))}, TokenIDs: []int{i}, BlockSize: 16, Medium: MediumGPU},
	}}
}

// recvTimeout receives from s or fails the test after testTimeout.
func recvTimeout(t *testing.T, s zmq4.Socket) zmq4.Msg {
	t.Helper()
	type res struct {
		m   zmq4.Msg
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := s.Recv()
		ch <- res{m, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("recv: %v", r.err)
		}
		return r.m
	case <-time.After(testTimeout):
		t.Fatal("timed out waiting for a message")
	}
	return zmq4.Msg{}
}

// syncSub publishes until sub receives, beating the slow-joiner loss, and
// returns the first sequence number received.
func syncSub(t *testing.T, p *Publisher, sub zmq4.Socket) uint64 {
	t.Helper()
	got := make(chan uint64, 1)
	go func() {
		m, err := sub.Recv()
		if err == nil && len(m.Frames) == 3 {
			got <- binary.BigEndian.Uint64(m.Frames[1])
		}
	}()
	deadline := time.After(testTimeout)
	for i := 0; ; i++ {
		if err := p.Publish(batchN(-1)); err != nil {
			t.Fatal(err)
		}
		select {
		case seq := <-got:
			return seq
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
			sub := zmq4.NewSub(ctx)
			defer sub.Close()
			if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
				t.Fatal(err)
			}
			cfg := PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Topic: "kv@10.0.0.1:8000@m", Encoding: tc.enc}
			if tc.connect {
				if err := sub.Listen("tcp://127.0.0.1:*"); err != nil {
					t.Fatal(err)
				}
				cfg.Endpoint = "tcp://" + sub.Addr().String()
			}
			p, err := NewPublisher(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if !tc.connect {
				if err := sub.Dial("tcp://" + p.Addr().String()); err != nil {
					t.Fatal(err)
				}
			}
			last := syncSub(t, p, sub)
			// Drain what the sync loop sent after the first one arrived.
			for p.Stats().Published > last+1 {
				m := recvTimeout(t, sub)
				last = binary.BigEndian.Uint64(m.Frames[1])
			}
			for i := range 5 {
				if err := p.Publish(batchN(i)); err != nil {
					t.Fatal(err)
				}
				m := recvTimeout(t, sub)
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
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial("tcp://" + p.ReplayAddr().String()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		start uint64
		want  []uint64 // the ring holds the last 4 of seq 0..5
	}{
		{0, []uint64{2, 3, 4, 5}},
		{4, []uint64{4, 5}},
		{9, nil},
	} {
		if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, seqBytes(tc.start))); err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for {
			m := recvTimeout(t, dealer)
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
