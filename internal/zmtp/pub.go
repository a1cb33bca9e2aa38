package zmtp

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for a zero PubConfig.
const (
	DefaultSendQueue    = 1024
	DefaultWriteTimeout = 5 * time.Second
	// maxSubscriptions bounds the prefixes one subscriber may register.
	maxSubscriptions = 64
)

// PubConfig configures a Pub.
type PubConfig struct {
	// SendQueue bounds each subscriber's queue, in messages (ZMQ's send
	// high-water mark); beyond it that subscriber loses messages.
	SendQueue int
	// WriteTimeout bounds one message's write to a subscriber; a subscriber
	// that does not read for that long is disconnected.
	WriteTimeout time.Duration
}

// PubStats counts a Pub's deliveries.
type PubStats struct {
	Dropped      uint64 // messages a subscriber lost to its full queue
	Disconnected uint64 // subscribers dropped for not reading
}

// Pub fans messages out to the subscribed peers it is given (as a Server
// or Redial handler). Send never blocks: every subscriber has its own
// bounded queue and writer goroutine.
type Pub struct {
	cfg PubConfig

	mu   sync.Mutex
	subs map[*subscriber]struct{}

	dropped, disconnected atomic.Uint64
}

type subscriber struct {
	c *Conn
	q chan [][]byte

	mu     sync.Mutex // guards topics, written by the reader
	topics [][]byte
}

// NewPub returns a Pub with no subscribers.
func NewPub(cfg PubConfig) *Pub {
	if cfg.SendQueue <= 0 {
		cfg.SendQueue = DefaultSendQueue
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	return &Pub{cfg: cfg, subs: make(map[*subscriber]struct{})}
}

// Serve runs one subscriber's connection until it fails or ctx ends: it
// reads the peer's subscriptions and writes what Send queues for it.
func (p *Pub) Serve(ctx context.Context, c *Conn) {
	s := &subscriber{c: c, q: make(chan [][]byte, p.cfg.SendQueue)}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	read := make(chan struct{})
	defer func() {
		p.mu.Lock()
		delete(p.subs, s)
		p.mu.Unlock()
		cancel()
		_ = c.Close()
		<-read
	}()
	go func() {
		defer close(read)
		defer cancel()
		for {
			m, err := c.Recv()
			if err != nil {
				return
			}
			if m.Subscribe || m.Cancel {
				s.subscribe(m.Topic, m.Subscribe)
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case frames := <-s.q:
			if err := c.Send(time.Now().Add(p.cfg.WriteTimeout), frames...); err != nil {
				if ctx.Err() == nil {
					p.disconnected.Add(1)
				}
				return
			}
		}
	}
}

func (s *subscriber) subscribe(topic []byte, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, t := range s.topics {
		if bytes.Equal(t, topic) {
			if !on {
				s.topics = append(s.topics[:i], s.topics[i+1:]...)
			}
			return
		}
	}
	if on && len(s.topics) < maxSubscriptions {
		s.topics = append(s.topics, bytes.Clone(topic))
	}
}

func (s *subscriber) wants(first []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.topics {
		if bytes.HasPrefix(first, t) {
			return true
		}
	}
	return false
}

// Send queues a message for every subscriber whose subscription matches
// its first frame; a subscriber whose queue is full loses it. The frames
// must not be modified afterwards.
func (p *Pub) Send(frames ...[]byte) {
	if len(frames) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		if !s.wants(frames[0]) {
			continue
		}
		select {
		case s.q <- frames:
		default:
			p.dropped.Add(1)
		}
	}
}

// Subscribers counts the connected peers with at least one subscription.
func (p *Pub) Subscribers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for s := range p.subs {
		s.mu.Lock()
		if len(s.topics) > 0 {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// Stats returns the Pub's counters.
func (p *Pub) Stats() PubStats {
	return PubStats{Dropped: p.dropped.Load(), Disconnected: p.disconnected.Load()}
}
