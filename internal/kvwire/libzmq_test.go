package kvwire

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp/libzmqtest"
)

// TestLibzmqReplayClient asks the publisher's replay socket for batches
// with the real libzmq DEALER, as a libzmq-based subscriber would.
func TestLibzmqReplayClient(t *testing.T) {
	bin := libzmqtest.Build(t, "zdealer")
	p, err := NewPublisher(t.Context(), PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", ReplaySize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sizes := make([]int, 6)
	for i := range sizes {
		if err := p.Publish(batchN(i)); err != nil {
			t.Fatal(err)
		}
		payload, _ := Encode(batchN(i), EncodingArray)
		sizes[i] = len(payload)
	}
	proc := libzmqtest.Start(t, bin, "tcp://"+p.ReplayAddr().String(), "3")
	var got []string
	for {
		l := proc.Line(t, testTimeout)
		if l == "end" {
			break
		}
		got = append(got, l)
	}
	want := fmt.Sprintf("3 %d|4 %d|5 %d", sizes[3], sizes[4], sizes[5])
	if strings.Join(got, "|") != want {
		t.Fatalf("libzmq replayed %q, want %q", got, want)
	}
}

// TestLibzmqSubscribesToPublisher reads the publisher's stream with the
// real libzmq SUB.
func TestLibzmqSubscribesToPublisher(t *testing.T) {
	bin := libzmqtest.Build(t, "zsub")
	p, err := NewPublisher(t.Context(), PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Topic: "kv@10.0.0.1:8000@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proc := libzmqtest.Start(t, bin, "connect", "tcp://"+p.Addr().String(), "3")
	// Publish until libzmq has three messages: the slow joiner loses the
	// first ones.
	var lines []string
	deadline := time.Now().Add(testTimeout)
	for len(lines) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("libzmq received nothing")
		}
		if err := p.Publish(batchN(7)); err != nil {
			t.Fatal(err)
		}
		select {
		case l, ok := <-proc.Lines:
			if !ok {
				t.Fatal("zsub ended early")
			}
			lines = append(lines, l)
		case <-time.After(5 * time.Millisecond):
		}
	}
	payload, _ := Encode(batchN(7), EncodingArray)
	for _, l := range lines {
		if f := strings.Fields(l); len(f) != 4 || f[0] != "3" || !strings.HasPrefix(f[1], "18:") ||
			!strings.HasPrefix(f[2], "8:") || !strings.HasPrefix(f[3], fmt.Sprintf("%d:", len(payload))) {
			t.Fatalf("libzmq read %q", l)
		}
	}
}
