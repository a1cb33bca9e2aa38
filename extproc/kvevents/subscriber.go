package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
)

// Defaults for a zero Config.
const (
	DefaultWorkers       = 4
	DefaultQueueSize     = 4096
	DefaultMaxEndpoints  = 4096
	DefaultReplayTimeout = 2 * time.Second
)

// Config configures a Subscriber.
type Config struct {
	// Bind is the central SUB endpoint servers connect to, e.g.
	// tcp://*:5557; empty for none.
	Bind string
	// Workers is the number of ordered apply queues; endpoints are spread
	// over them by hash.
	Workers int
	// QueueSize bounds each worker's queue, in messages.
	QueueSize int
	// MaxEndpoints bounds the endpoints whose sequence state is tracked;
	// beyond it the endpoint heard from least recently is forgotten.
	MaxEndpoints int
	// ReplayTimeout bounds one replay exchange with a publisher.
	ReplayTimeout time.Duration
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Source says how an endpoint's events arrive.
type Source struct {
	// Events is a ZMQ endpoint (tcp://ip:port) the subscriber connects to
	// for this endpoint's events; empty when the server publishes to the
	// central socket. A server must use one path, not both: one stream
	// arriving twice reads as endless restarts.
	Events string
	// Replay is the server's replay ROUTER endpoint, empty when it has
	// none.
	Replay string
}

// Subscriber feeds a kvindex.Index from KV event streams. Its methods are
// safe for concurrent use.
type Subscriber struct {
	cfg     Config
	idx     *kvindex.Index
	log     *slog.Logger
	m       *metrics
	ctx     context.Context
	cancel  context.CancelFunc
	central zmq4.Socket // nil without Config.Bind
	workers []*worker
	seed    maphash.Seed
	wg      sync.WaitGroup // readers and workers

	mu      sync.Mutex // guards sources
	sources map[string]*source
}

// source is one configured endpoint; its socket belongs to its reader
// goroutine, which cancel stops.
type source struct {
	Source
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader has closed its socket
}

// New starts a subscriber applying events to idx; it binds Config.Bind
// before returning. Close stops it.
func New(ctx context.Context, idx *kvindex.Index, cfg Config) (*Subscriber, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.MaxEndpoints <= 0 {
		cfg.MaxEndpoints = DefaultMaxEndpoints
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Subscriber{
		cfg:     cfg,
		idx:     idx,
		log:     cfg.Logger.With("component", "kvevents"),
		ctx:     ctx,
		cancel:  cancel,
		seed:    maphash.MakeSeed(),
		sources: make(map[string]*source),
	}
	m, err := newMetrics(reg, idx, s.queued)
	if err != nil {
		cancel()
		return nil, err
	}
	s.m = m
	perWorker := (cfg.MaxEndpoints + cfg.Workers - 1) / cfg.Workers
	for range cfg.Workers {
		w := &worker{
			s:            s,
			q:            make(chan item, cfg.QueueSize),
			states:       make(map[string]*seqState),
			maxEndpoints: perWorker,
		}
		s.workers = append(s.workers, w)
		s.wg.Go(w.run)
	}
	if cfg.Bind != "" {
		s.central = zmq4.NewSub(ctx, socketOptions(cfg.Bind, s.log)...)
		if err := s.central.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			s.Close()
			return nil, fmt.Errorf("kvevents: subscribe: %w", err)
		}
		if err := s.central.Listen(cfg.Bind); err != nil {
			s.Close()
			return nil, fmt.Errorf("kvevents: bind %s: %w", cfg.Bind, err)
		}
		s.wg.Go(func() { s.read(ctx, s.central, "") })
	}
	return s, nil
}

// socketOptions route zmq4's log lines to slog at debug level and make a
// connecting socket retry forever and redial after a disconnect, as libzmq
// does (closing the socket ends it). A bound socket must not get automatic
// reconnection: zmq4 would dial its own address.
func socketOptions(endpoint string, log *slog.Logger) []zmq4.Option {
	opts := []zmq4.Option{zmq4.WithLogger(slog.NewLogLogger(log.Handler(), slog.LevelDebug))}
	if !kvwire.Binds(endpoint) {
		opts = append(opts, zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
	}
	return opts
}

// Addr is the central socket's bound address (nil without Config.Bind),
// which tells the port picked for a tcp://host:* endpoint.
func (s *Subscriber) Addr() net.Addr {
	if s.central == nil {
		return nil
	}
	return s.central.Addr()
}

// AddEndpoint registers an endpoint (its ip:port, the index's key) and how
// its events arrive. With Source.Events set it connects a SUB socket to it,
// in the background and retrying until Close or EndpointRemoved. Calling
// it again with another Source replaces the endpoint's socket; with the
// same Source it does nothing.
func (s *Subscriber) AddEndpoint(endpoint string, src Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	old, ok := s.sources[endpoint]
	if ok && old.Source == src {
		return
	}
	if ok {
		old.cancel()
	}
	ctx, cancel := context.WithCancel(s.ctx)
	sc := &source{Source: src, cancel: cancel, done: make(chan struct{})}
	s.sources[endpoint] = sc
	if src.Events == "" {
		close(sc.done)
		return
	}
	s.wg.Go(func() {
		defer close(sc.done)
		s.follow(ctx, endpoint, src.Events)
	})
}

// EndpointRemoved forgets an endpoint that left the pool: it closes the
// endpoint's socket and, after the events already queued for it, clears
// its entries. It may wait for the endpoint's worker to make room in its
// queue.
func (s *Subscriber) EndpointRemoved(endpoint string) {
	s.mu.Lock()
	sc, ok := s.sources[endpoint]
	delete(s.sources, endpoint)
	s.mu.Unlock()
	if ok {
		sc.cancel()
		<-sc.done
	}
	select {
	case s.workerOf(endpoint).q <- item{endpoint: endpoint, remove: true}:
	case <-s.ctx.Done():
		s.idx.ClearEndpoint(endpoint)
	}
}

// replayOf returns the endpoint's replay socket address, if any.
func (s *Subscriber) replayOf(endpoint string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sc, ok := s.sources[endpoint]; ok {
		return sc.Replay
	}
	return ""
}

// follow connects a SUB socket to one endpoint's publisher and reads it
// until ctx ends.
func (s *Subscriber) follow(ctx context.Context, endpoint, addr string) {
	sock := zmq4.NewSub(ctx, socketOptions(addr, s.log)...)
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		s.log.Error("kv events subscribe failed", "endpoint", endpoint, "err", err)
		return
	}
	if kvwire.Binds(addr) {
		if err := sock.Listen(addr); err != nil {
			s.log.Error("kv events bind failed", "endpoint", endpoint, "addr", addr, "err", err)
			return
		}
	} else {
		// Dial blocks until the first connection (the socket redials by
		// itself after that) and returns once ctx ends.
		dialed := make(chan struct{})
		defer func() { <-dialed }()
		go func() {
			defer close(dialed)
			if err := sock.Dial(addr); err != nil && ctx.Err() == nil {
				s.log.Warn("kv events connect failed", "endpoint", endpoint, "addr", addr, "err", err)
			}
		}()
	}
	s.read(ctx, sock, endpoint)
}

// read receives from sock until ctx ends. A fixed endpoint names the
// sender of every message; otherwise the topic does.
func (s *Subscriber) read(ctx context.Context, sock zmq4.Socket, endpoint string) {
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A peer went away; zmq4 reports it once per connection.
			s.log.Debug("kv events receive", "endpoint", endpoint, "err", err)
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			s.m.dropped.WithLabelValues(dropBadFrames).Inc()
			continue
		}
		ep := endpoint
		if ep == "" {
			var ok bool
			if ep, _, ok = kvwire.ParseTopic(string(msg.Frames[0])); !ok {
				s.m.dropped.WithLabelValues(dropBadTopic).Inc()
				continue
			}
			// Only the pool's endpoints may put entries in the index: a
			// topic names any address, and entries (and index ids) of
			// endpoints nobody will ever remove would only accumulate.
			if !s.configured(ep) {
				s.m.dropped.WithLabelValues(dropUnknownEndpoint).Inc()
				continue
			}
		}
		it := item{endpoint: ep, seq: binary.BigEndian.Uint64(msg.Frames[1]), payload: msg.Frames[2]}
		select {
		case s.workerOf(ep).q <- it:
		default:
			s.m.dropped.WithLabelValues(dropQueueFull).Inc()
		}
	}
}

// configured reports whether endpoint was added and not removed.
func (s *Subscriber) configured(endpoint string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sources[endpoint]
	return ok
}

func (s *Subscriber) workerOf(endpoint string) *worker {
	return s.workers[maphash.String(s.seed, endpoint)%uint64(len(s.workers))]
}

func (s *Subscriber) queued() int {
	n := 0
	for _, w := range s.workers {
		n += len(w.q)
	}
	return n
}

// Close stops every socket and worker. Messages still queued are dropped.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.cancel()
	s.mu.Unlock()
	var err error
	if s.central != nil {
		err = s.central.Close()
	}
	s.wg.Wait()
	if errors.Is(err, context.Canceled) || errors.Is(err, net.ErrClosed) {
		// Cancelling the context has already closed the connections.
		err = nil
	}
	return err
}
