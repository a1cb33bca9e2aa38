package delaylink

import (
	"io"
	"testing"
	"time"
)

// TestDelay: a TCP round trip over the link takes at least Delay, and the
// added delay dominates (compared with the same exchange undelayed is not
// possible inside one link, so the bound is the configured one and a
// generous ceiling that only a broken forwarder exceeds).
func TestDelay(t *testing.T) {
	const delay = 15 * time.Millisecond
	l := New(t, Options{Delay: delay})
	ln, err := l.Listen(l.B, l.AddrB.String()+":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer Echo(ln)()
	defer ln.Close()
	c, err := l.Dial(l.A, l.AddrB.String()+":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	var best time.Duration
	for i := range 10 {
		start := time.Now()
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); i == 0 || d < best {
			best = d
		}
	}
	if best < delay {
		t.Fatalf("fastest round trip %v is below the added delay %v", best, delay)
	}
	if l.Forwarded() == 0 {
		t.Fatal("nothing forwarded")
	}
	t.Logf("fastest round trip %v (delay %v), forwarded %d", best, delay, l.Forwarded())
}

// TestDropEvery: dropped data segments are retransmitted and the stream
// still arrives whole.
func TestDropEvery(t *testing.T) {
	l := New(t, Options{Delay: time.Millisecond, DropEvery: 10})
	ln, err := l.Listen(l.B, l.AddrB.String()+":7001")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	c, err := l.Dial(l.A, l.AddrB.String()+":7001")
	if err != nil {
		t.Fatal(err)
	}
	const total = 2 << 20
	if _, err := c.Write(make([]byte, total)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if n := <-got; n != total {
		t.Fatalf("received %d of %d bytes", n, total)
	}
	if l.Dropped() == 0 {
		t.Fatal("nothing dropped")
	}
}
