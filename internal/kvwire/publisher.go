package kvwire

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"time"

	"github.com/kvgate/kvgate/internal/zmtp"
)

// ReplayEnd is the sequence number of the replay protocol's end marker
// (-1 as a signed 64-bit integer).
const ReplayEnd = ^uint64(0)

// Publisher defaults, vLLM's where it has one.
const (
	DefaultEndpoint   = "tcp://*:5557"
	DefaultQueueSize  = 1024
	DefaultReplaySize = 10000 // vLLM's buffer_steps
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("kvwire: publisher closed")

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Endpoint is where the PUB socket lives. As in vLLM, an address with
	// "*" or "::", or an ipc:// one, is bound (tcp://*:5557); any other is
	// connected to (a picker's central tcp://10.0.0.9:5557), retrying with
	// a bounded backoff until it answers and again after it goes away.
	Endpoint string
	// ReplayEndpoint, when set, gets a ROUTER socket serving replay
	// requests; the same bind-or-connect rule applies.
	ReplayEndpoint string
	// Topic is the first frame of every message; llm-d's convention is
	// kv@<ip:port>@<model>.
	Topic    string
	Encoding Encoding
	// QueueSize bounds each subscriber's send queue (its high-water mark):
	// a subscriber that falls further behind loses batches, one that stops
	// reading for WriteTimeout is disconnected. Publish never waits for
	// either.
	QueueSize int
	// WriteTimeout bounds one write to a subscriber.
	WriteTimeout time.Duration
	// ReplaySize bounds the batches kept for replay.
	ReplaySize int
	// TLS, when set, runs both sockets over TLS: as the server side when
	// they bind, the client side when they connect.
	TLS    *tls.Config
	Logger *slog.Logger
}

// PublisherStats counts a publisher's batches.
type PublisherStats struct {
	Published    uint64 // given a sequence number
	Dropped      uint64 // (batch, subscriber) pairs lost to a full send queue
	Disconnected uint64 // subscribers disconnected for not reading
	Replays      uint64 // replay requests served
}

type message struct {
	seq     uint64
	payload []byte
}

// Publisher sends event batches over ZMTP PUB with vLLM's framing: topic,
// 8-byte big-endian sequence number from 0, msgpack payload.
//
// Publish never blocks on the network. It numbers the batch, keeps it in
// the replay ring, and queues it for each subscriber (internal/zmtp.Pub).
// A subscriber whose queue is full loses the batch (it keeps its sequence
// number and its place in the replay ring, so the subscriber sees a gap and
// can fetch it through replay); one that does not read at all is
// disconnected after WriteTimeout, so no subscriber can stall the engine
// that publishes.
type Publisher struct {
	cfg    PublisherConfig
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	pub    *zmtp.Pub
	server *zmtp.Server // the PUB socket when bound
	router *zmtp.Server // the replay socket when bound
	wg     sync.WaitGroup

	// mu orders sequence numbers, the ring and the sends.
	mu     sync.Mutex
	closed bool
	next   uint64
	ring   []message // the last ReplaySize batches
	ringAt int       // index of the oldest batch once the ring is full

	published, replays atomic.Uint64
}

// NewPublisher opens the sockets. It returns once bound sockets listen;
// connecting sockets connect in the background until ctx ends or Close.
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.ReplaySize <= 0 {
		cfg.ReplaySize = DefaultReplaySize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "kvevents-publisher", "endpoint", cfg.Endpoint),
		ctx:    ctx,
		cancel: cancel,
		pub:    zmtp.NewPub(zmtp.PubConfig{SendQueue: cfg.QueueSize, WriteTimeout: cfg.WriteTimeout}),
	}
	var err error
	if p.server, err = p.open(cfg.Endpoint, zmtp.PUB, p.pub.Serve); err != nil {
		cancel()
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		if p.router, err = p.open(cfg.ReplayEndpoint, zmtp.ROUTER, p.serveReplay); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// open binds endpoint (returning its server) or keeps connecting to it,
// by vLLM's rule (Binds).
func (p *Publisher) open(endpoint string, typ zmtp.Type, handler func(context.Context, *zmtp.Conn)) (*zmtp.Server, error) {
	hs := zmtp.HandshakeConfig{Type: typ}
	if Binds(endpoint) {
		s, err := zmtp.Listen(p.ctx, endpoint, zmtp.ServerConfig{HandshakeConfig: hs, TLS: p.cfg.TLS, Logger: p.log}, handler)
		if err != nil {
			return nil, fmt.Errorf("kvwire: %w", err)
		}
		return s, nil
	}
	if _, _, err := zmtp.ParseEndpoint(endpoint); err != nil {
		return nil, fmt.Errorf("kvwire: %w", err)
	}
	p.wg.Go(func() {
		zmtp.Redial(p.ctx, endpoint, zmtp.DialConfig{HandshakeConfig: hs, TLS: p.cfg.TLS, Logger: p.log}, handler)
	})
	return nil, nil
}

// Binds reports whether vLLM would bind (rather than connect) a socket to
// endpoint.
func Binds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// Addr is the PUB socket's bound address (nil when it connects), which
// tells the port picked for a tcp://host:* endpoint.
func (p *Publisher) Addr() net.Addr {
	if p.server == nil {
		return nil
	}
	return p.server.Addr()
}

// ReplayAddr is the replay socket's bound address, or nil.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.router == nil {
		return nil
	}
	return p.router.Addr()
}

// Subscribers counts the peers subscribed to the PUB socket.
func (p *Publisher) Subscribers() int { return p.pub.Subscribers() }

// Publish encodes and queues a batch; it never blocks on the network.
// It fails only on an encoding error or after Close.
func (p *Publisher) Publish(b EventBatch) error {
	payload, err := Encode(b, p.cfg.Encoding)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	m := message{seq: p.next, payload: payload}
	p.next++
	if len(p.ring) < p.cfg.ReplaySize {
		p.ring = append(p.ring, m)
	} else {
		p.ring[p.ringAt] = m
		p.ringAt = (p.ringAt + 1) % len(p.ring)
	}
	p.published.Add(1)
	p.pub.Send([]byte(p.cfg.Topic), seqBytes(m.seq), m.payload)
	return nil
}

func seqBytes(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// replayFrom copies the ring's batches numbered start and later, in order.
func (p *Publisher) replayFrom(start uint64) []message {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []message
	for i := range p.ring {
		m := p.ring[(p.ringAt+i)%len(p.ring)]
		if m.seq >= start {
			out = append(out, m)
		}
	}
	return out
}

// replayWriteTimeout bounds one reply message to a replay client.
const replayWriteTimeout = 5 * time.Second

// serveReplay answers one replay client's requests, ["", start_seq] as a
// DEALER or REQ peer sends them (a ROUTER application sees its identity
// first), with ["", seq, payload] for each buffered batch from start_seq,
// then ["", ReplayEnd, ""]. Each client has its own connection and
// goroutine, so a slow one delays only itself.
func (p *Publisher) serveReplay(ctx context.Context, c *zmtp.Conn) {
	empty := []byte{}
	for ctx.Err() == nil {
		req, err := c.Recv()
		if err != nil {
			return
		}
		if len(req.Frames) != 2 || len(req.Frames[0]) != 0 || len(req.Frames[1]) != 8 {
			p.log.Debug("malformed kv events replay request", "frames", len(req.Frames))
			continue
		}
		start := binary.BigEndian.Uint64(req.Frames[1])
		p.replays.Add(1)
		for _, m := range p.replayFrom(start) {
			if err := c.Send(time.Now().Add(replayWriteTimeout), empty, seqBytes(m.seq), m.payload); err != nil {
				p.log.Debug("kv events replay send failed", "err", err)
				return
			}
		}
		if err := c.Send(time.Now().Add(replayWriteTimeout), empty, seqBytes(ReplayEnd), empty); err != nil {
			p.log.Debug("kv events replay end marker failed", "err", err)
			return
		}
	}
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	ps := p.pub.Stats()
	return PublisherStats{
		Published: p.published.Load(), Dropped: ps.Dropped, Disconnected: ps.Disconnected, Replays: p.replays.Load(),
	}
}

// Close stops the publisher and closes its connections; batches still in
// subscribers' queues are not awaited.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	for _, s := range []*zmtp.Server{p.server, p.router} {
		if s != nil {
			_ = s.Close()
		}
	}
	p.wg.Wait()
	return nil
}
