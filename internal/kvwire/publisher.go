package kvwire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
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
	// connected to (a picker's central tcp://10.0.0.9:5557), retrying until
	// it answers and again after it goes away.
	Endpoint string
	// ReplayEndpoint, when set, gets a ROUTER socket serving replay
	// requests; the same bind-or-connect rule applies.
	ReplayEndpoint string
	// Topic is the first frame of every message; llm-d's convention is
	// kv@<ip:port>@<model>.
	Topic    string
	Encoding Encoding
	// QueueSize bounds the batches waiting to be sent, and separately the
	// socket's own send queue (its high-water mark).
	QueueSize int
	// ReplaySize bounds the batches kept for replay.
	ReplaySize int
	Logger     *slog.Logger
}

// PublisherStats counts a publisher's batches.
type PublisherStats struct {
	Published uint64 // given a sequence number
	Dropped   uint64 // dropped because the send queue was full
	Replays   uint64 // replay requests served
}

type message struct {
	seq     uint64
	payload []byte
}

// Publisher sends event batches over ZMQ PUB with vLLM's framing: topic,
// 8-byte big-endian sequence number from 0, msgpack payload.
//
// Publish never blocks on the network. It numbers the batch, keeps it in
// the replay ring, and queues it for the sender goroutine; when the queue is
// full the batch is dropped from the live stream and counted (drop newest,
// so what subscribers already have stays consistent). A dropped batch keeps
// its sequence number and its place in the replay ring, so subscribers see
// a gap and can fetch it through replay. The PUB socket's own queue is
// bounded by the same size (its high-water mark) and drops silently when a
// subscriber's connection cannot keep up, which subscribers again see as a
// gap.
type Publisher struct {
	cfg    PublisherConfig
	log    *slog.Logger
	cancel context.CancelFunc
	pub    zmq4.Socket
	router zmq4.Socket    // nil without replay
	wg     sync.WaitGroup // dialers and the replay server
	sent   chan struct{}  // closed when the sender has drained the queue

	// mu orders sequence numbers, the ring and the queue, so that the
	// queue holds batches in sequence order.
	mu     sync.Mutex
	closed bool
	next   uint64
	queue  chan message
	ring   []message // the last ReplaySize batches
	ringAt int       // index of the oldest batch once the ring is full

	published, dropped, replays atomic.Uint64
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
		cancel: cancel,
		queue:  make(chan message, cfg.QueueSize),
		sent:   make(chan struct{}),
	}
	p.pub = zmq4.NewPub(ctx, socketOptions(cfg.Endpoint, p.log)...)
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.QueueSize); err != nil {
		_ = p.pub.Close()
		cancel()
		return nil, fmt.Errorf("kvwire: set PUB high-water mark: %w", err)
	}
	if err := p.open(ctx, p.pub, cfg.Endpoint); err != nil {
		_ = p.pub.Close()
		cancel()
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx, socketOptions(cfg.ReplayEndpoint, p.log)...)
		if err := p.open(ctx, p.router, cfg.ReplayEndpoint); err != nil {
			_ = p.pub.Close()
			_ = p.router.Close()
			cancel()
			return nil, err
		}
		p.wg.Go(func() { p.serveReplay(ctx) })
	}
	go p.send()
	return p, nil
}

// socketOptions route zmq4's own log lines to slog at debug level and make
// a socket that connects retry forever and redial after a disconnect, as
// libzmq does (closing the socket ends the retries). zmq4 would also
// "redial" a bound socket's address, so only connecting sockets get it.
func socketOptions(endpoint string, log *slog.Logger) []zmq4.Option {
	opts := []zmq4.Option{zmq4.WithLogger(slog.NewLogLogger(log.Handler(), slog.LevelDebug))}
	if !Binds(endpoint) {
		opts = append(opts, zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
	}
	return opts
}

// Binds reports whether vLLM would bind (rather than connect) a socket to
// endpoint.
func Binds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

func (p *Publisher) open(ctx context.Context, s zmq4.Socket, endpoint string) error {
	if Binds(endpoint) {
		if err := s.Listen(endpoint); err != nil {
			return fmt.Errorf("kvwire: bind %s: %w", endpoint, err)
		}
		return nil
	}
	p.wg.Go(func() {
		if err := s.Dial(endpoint); err != nil && ctx.Err() == nil {
			p.log.Warn("kv events socket could not connect", "to", endpoint, "err", err)
		}
	})
	return nil
}

// Addr is the PUB socket's bound address (nil when it connects), which
// tells the port picked for a tcp://host:* endpoint.
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay socket's bound address, or nil.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.router == nil {
		return nil
	}
	return p.router.Addr()
}

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
	select {
	case p.queue <- m:
	default:
		p.dropped.Add(1)
	}
	return nil
}

// send is the only goroutine writing to the PUB socket.
func (p *Publisher) send() {
	defer close(p.sent)
	topic := []byte(p.cfg.Topic)
	for m := range p.queue {
		if err := p.pub.Send(zmq4.NewMsgFrom(topic, seqBytes(m.seq), m.payload)); err != nil {
			p.log.Debug("kv events send failed", "seq", m.seq, "err", err)
		}
	}
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

// serveReplay answers [identity, "", start_seq] with [identity, "", seq,
// payload] for each buffered batch from start_seq, then [identity, "",
// ReplayEnd, ""]. Requests are served one at a time.
func (p *Publisher) serveReplay(ctx context.Context) {
	empty := []byte{}
	for {
		req, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Debug("kv events replay receive failed", "err", err)
			continue
		}
		if len(req.Frames) != 3 || len(req.Frames[1]) != 0 || len(req.Frames[2]) != 8 {
			p.log.Debug("malformed kv events replay request", "frames", len(req.Frames))
			continue
		}
		id, start := req.Frames[0], binary.BigEndian.Uint64(req.Frames[2])
		p.replays.Add(1)
		for _, m := range p.replayFrom(start) {
			if err := p.router.Send(zmq4.NewMsgFrom(id, empty, seqBytes(m.seq), m.payload)); err != nil {
				p.log.Debug("kv events replay send failed", "err", err)
				break
			}
		}
		if err := p.router.Send(zmq4.NewMsgFrom(id, empty, seqBytes(ReplayEnd), empty)); err != nil {
			p.log.Debug("kv events replay end marker failed", "err", err)
		}
	}
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{Published: p.published.Load(), Dropped: p.dropped.Load(), Replays: p.replays.Load()}
}

// Close stops the publisher. Batches still queued are handed to the socket
// first, but delivery of what the socket holds is not awaited.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.queue)
	p.mu.Unlock()

	<-p.sent
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, p.router.Close())
	}
	p.wg.Wait()
	return err
}
