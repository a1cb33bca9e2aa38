package kvevents

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/zmtp"
)

// Defaults for a zero Config.
const (
	DefaultWorkers          = 4
	DefaultQueueSize        = 4096
	DefaultMaxEndpoints     = 4096
	DefaultReplayTimeout    = 2 * time.Second
	DefaultMaxMessageSize   = zmtp.DefaultMaxMessageSize
	DefaultHandshakeTimeout = zmtp.DefaultHandshakeTimeout
	DefaultMessageTimeout   = 10 * time.Second
	DefaultMaxConns         = zmtp.DefaultMaxConns
	DefaultMemoryBudget     = 256 << 20
	DefaultPublisherMemory  = 32 << 20
	DefaultPublisherRate    = 5000     // messages per second
	DefaultPublisherBytes   = 64 << 20 // bytes per second
)

// Config configures a Subscriber.
type Config struct {
	// Bind is the central SUB endpoint servers connect to, e.g.
	// tcp://*:5557; empty for none.
	Bind string
	// BindRanks is how many consecutive ports the central socket binds,
	// from Bind's on (0 or 1: Bind's alone). vLLM's data-parallel rank r
	// connects its publisher to the configured port plus r
	// (kvwire.OffsetPort), so servers of n ranks per pod need n; more than
	// one needs a numeric port in Bind. A connection's port then tells the
	// rank its publisher was offset by (see Source.Server). MaxConns is
	// shared out among the ports.
	BindRanks int
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

	// MaxMessageSize bounds one message (topic, sequence and payload); a
	// peer declaring more is disconnected. The default, 16 MiB, is far
	// above a real engine step's batch (tens to hundreds of KiB).
	MaxMessageSize int64
	// HandshakeTimeout bounds a connection's ZMTP handshake, and
	// MessageTimeout the time from a message's first byte to its last.
	HandshakeTimeout, MessageTimeout time.Duration
	// MaxConns bounds the central socket's open connections.
	MaxConns int
	// MemoryBudget bounds the bytes of messages read and not yet applied,
	// and of the batch being decoded and applied for each (which can be 16
	// times its message), over all connections, beyond a floor of 128 KiB
	// each connection may always hold (so the intake holds at most
	// MemoryBudget + MaxConns × 128 KiB); PublisherMemory bounds one
	// connection. A connection whose next message would exceed either is
	// disconnected (its publisher reconnects and recovers as from any
	// loss); a batch whose decoded events would is dropped and its
	// endpoint cleared.
	MemoryBudget, PublisherMemory int64
	// PublisherRate and PublisherBytes bound one connection's messages and
	// bytes per second; a faster publisher is read more slowly. Negative
	// for no limit.
	PublisherRate, PublisherBytes float64
	// Authorize decides which peers may publish. It is asked with an empty
	// endpoint when a connection arrives on the central socket (before
	// anything is read from it), then with each endpoint a connection's
	// topics name. nil means the pool-membership rule: a peer may connect
	// when its IP is that of an endpoint of the pool (AddEndpoint) or
	// loopback, and may publish for an endpoint whose IP it has, or for
	// any from loopback (a sidecar proxy, a local fleet).
	Authorize func(remote netip.Addr, endpoint string) bool
	// TrustedNets extend the pool-membership rule (Authorize nil): a peer
	// in one of these networks is treated as loopback is, so it may
	// connect and publish for any endpoint (a proxy or sidecar network
	// that relays the servers' events).
	TrustedNets []netip.Prefix
	// TLS, when set, makes the sockets the subscriber binds accept only
	// TLS; DialTLS makes the connections it opens (per-endpoint, replay)
	// use TLS. vLLM's libzmq
	// does not speak TLS: these are for deployments that put a TLS proxy
	// in front of their model servers' sockets.
	TLS, DialTLS *tls.Config

	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Source says how an endpoint's events arrive.
type Source struct {
	// Events is a ZMQ endpoint (tcp://ip:port) the subscriber connects to
	// for this endpoint's events (or binds, by vLLM's rule: an address
	// with * or ::); empty when the server publishes to the central
	// socket. A server must use one path, not both: the second stream is
	// ignored while the first is connected.
	Events string
	// Replay is the server's replay ROUTER endpoint, empty when it has
	// none.
	Replay string
	// Server and Rank place the endpoint among the data-parallel ranks of
	// a server that serves each on an endpoint of its own (Server is empty
	// for a server's only endpoint); Rank is the endpoint's place in the
	// server (its port's), from 0. vLLM runs a publisher per rank and tags
	// each batch with its rank (data_parallel_rank), which is global
	// across the nodes of a deployment: a pod serving ranks 8-15 tags
	// them 8-15. The server's first rank is learned from the tags of a
	// connection whose rank is known (this endpoint's own Events socket,
	// or a port of a multi-port central bind, Config.BindRanks); a batch
	// tagged with another rank of the server is that rank's, and is
	// applied to its endpoint when the pool has one on this endpoint's
	// IP. Tags that contradict the learned first rank, or name a rank the
	// server has no endpoint for, are counted
	// (kvgate_kvevents_rank_mismatches_total) and logged once per server.
	Server string
	Rank   int
}

// dpServer is the pool's view of one data-parallel server: its ranks'
// endpoints and the global rank of its first one.
type dpServer struct {
	ranks map[int]string // endpoint of each rank, by its place in the server
	// start is the global rank (vLLM's tag) of the server's rank 0, once
	// a connection whose rank is known has carried a tagged batch; until
	// then tags are read as places (start 0).
	start      int
	startKnown bool
	warned     map[string]bool // mismatch reasons logged already
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
	central []*zmtp.Server // one per bound port; none without Config.Bind
	workers []*worker
	seed    maphash.Seed
	mem     budget
	peers   atomic.Uint64  // connection ids
	wg      sync.WaitGroup // readers and workers

	mu      sync.Mutex // guards sources, servers and hosts
	sources map[string]*source
	servers map[string]*dpServer // by Source.Server
	hosts   map[netip.Addr]int   // configured endpoints per IP
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
	cfg = withDefaults(cfg)
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
		mem:     budget{max: cfg.MemoryBudget},
		sources: make(map[string]*source),
		servers: make(map[string]*dpServer),
		hosts:   make(map[netip.Addr]int),
	}
	m, err := newMetrics(reg, idx, s.queued, func() int64 { return s.mem.used.Load() })
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
	if err := s.bindCentral(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	return s, nil
}

// bindCentral binds Config.Bind and, for Config.BindRanks, the ports after
// it, one per data-parallel rank offset.
func (s *Subscriber) bindCentral(ctx context.Context) error {
	if s.cfg.Bind == "" {
		return nil
	}
	n := max(s.cfg.BindRanks, 1)
	cfg := s.serverConfig(s.cfg.TLS)
	cfg.MaxConns = (s.cfg.MaxConns + n - 1) / n
	for r := range n {
		addr, err := kvwire.OffsetPort(s.cfg.Bind, r)
		if err != nil {
			return err
		}
		srv, err := zmtp.Listen(ctx, addr, cfg, func(ctx context.Context, c *zmtp.Conn) {
			s.readPeer(ctx, c, "", &peer{offset: r, offsetKnown: n > 1})
		})
		if err != nil {
			return err
		}
		s.central = append(s.central, srv)
	}
	return nil
}

func withDefaults(cfg Config) Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.Workers, DefaultWorkers)
	def(&cfg.QueueSize, DefaultQueueSize)
	def(&cfg.MaxEndpoints, DefaultMaxEndpoints)
	def(&cfg.MaxConns, DefaultMaxConns)
	for _, d := range []struct {
		v *time.Duration
		d time.Duration
	}{{&cfg.ReplayTimeout, DefaultReplayTimeout}, {&cfg.HandshakeTimeout, DefaultHandshakeTimeout}, {&cfg.MessageTimeout, DefaultMessageTimeout}} {
		if *d.v <= 0 {
			*d.v = d.d
		}
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = DefaultMaxMessageSize
	}
	if cfg.MemoryBudget <= 0 {
		cfg.MemoryBudget = DefaultMemoryBudget
	}
	if cfg.PublisherMemory <= 0 {
		cfg.PublisherMemory = DefaultPublisherMemory
	}
	// One message must fit a publisher's share, and a share the budget.
	cfg.PublisherMemory = max(cfg.PublisherMemory, cfg.MaxMessageSize)
	cfg.MemoryBudget = max(cfg.MemoryBudget, cfg.PublisherMemory)
	if cfg.PublisherRate == 0 {
		cfg.PublisherRate = DefaultPublisherRate
	}
	if cfg.PublisherBytes == 0 {
		cfg.PublisherBytes = DefaultPublisherBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

func (s *Subscriber) handshake(typ zmtp.Type) zmtp.HandshakeConfig {
	return zmtp.HandshakeConfig{Type: typ, Limits: zmtp.Limits{
		MaxMessageSize: s.cfg.MaxMessageSize, MaxFrames: maxFrames, MessageTimeout: s.cfg.MessageTimeout,
	}}
}

// maxFrames: an event message has three frames; a few more are read (and
// counted as bad) rather than ending the connection.
const maxFrames = 8

func (s *Subscriber) serverConfig(tc *tls.Config) zmtp.ServerConfig {
	return zmtp.ServerConfig{
		HandshakeConfig:  s.handshake(zmtp.SUB),
		HandshakeTimeout: s.cfg.HandshakeTimeout,
		MaxConns:         s.cfg.MaxConns,
		Admit:            func(remote net.Addr) bool { return s.authorized(remote, "") },
		TLS:              tc,
		Rejected:         func(reason string) { s.m.rejected.WithLabelValues(reason).Inc() },
		Logger:           s.log,
	}
}

func (s *Subscriber) dialConfig(typ zmtp.Type) zmtp.DialConfig {
	return zmtp.DialConfig{HandshakeConfig: s.handshake(typ), HandshakeTimeout: s.cfg.HandshakeTimeout, TLS: s.cfg.DialTLS, Logger: s.log}
}

// authorized applies Config.Authorize, or the pool-membership rule, to a
// peer's address.
func (s *Subscriber) authorized(remote net.Addr, endpoint string) bool {
	ip := remoteIP(remote)
	if s.cfg.Authorize != nil {
		return s.cfg.Authorize(ip, endpoint)
	}
	if ip.IsLoopback() || s.trusted(ip) {
		return true
	}
	if endpoint == "" {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.hosts[ip] > 0
	}
	host, ok := endpointIP(endpoint)
	return ok && host == ip
}

func (s *Subscriber) trusted(ip netip.Addr) bool {
	for _, n := range s.cfg.TrustedNets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

func remoteIP(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return ip.Unmap()
	}
	return netip.IPv6Loopback() // a unix socket's peer is on this host
}

// endpointIP is the IP of an ip:port endpoint.
func endpointIP(endpoint string) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(endpoint)
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// Addr is the central socket's (first) bound address (nil without
// Config.Bind), which tells the port picked for a tcp://host:* endpoint.
func (s *Subscriber) Addr() net.Addr {
	if len(s.central) == 0 {
		return nil
	}
	return s.central[0].Addr()
}

// AddEndpoint registers an endpoint (its ip:port, the index's key) and how
// its events arrive. With Source.Events set it connects a SUB socket to it,
// in the background and retrying until Close or EndpointRemoved. Calling
// it again with another Source replaces the endpoint's socket (the new one
// starts once the old one's reader has stopped, so the two streams never
// interleave); with the same Source it does nothing.
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
	var prev chan struct{}
	if ok {
		old.cancel()
		prev = old.done
		s.forgetRankLocked(endpoint, old.Source)
	} else if ip, isIP := endpointIP(endpoint); isIP {
		s.hosts[ip]++
	}
	if src.Server != "" {
		srv := s.servers[src.Server]
		if srv == nil {
			srv = &dpServer{ranks: make(map[int]string)}
			s.servers[src.Server] = srv
		}
		srv.ranks[src.Rank] = endpoint
	}
	ctx, cancel := context.WithCancel(s.ctx)
	sc := &source{Source: src, cancel: cancel, done: make(chan struct{})}
	s.sources[endpoint] = sc
	if src.Events == "" && prev == nil {
		close(sc.done)
		return
	}
	s.wg.Go(func() {
		defer close(sc.done)
		if prev != nil {
			<-prev
		}
		if src.Events != "" {
			s.follow(ctx, endpoint, src)
		}
	})
}

// EndpointRemoved forgets an endpoint that left the pool: it closes the
// endpoint's socket and, after the events already queued for it, clears
// its entries. It may wait for the endpoint's worker to make room in its
// queue.
func (s *Subscriber) EndpointRemoved(endpoint string) {
	s.mu.Lock()
	sc, ok := s.sources[endpoint]
	if ok {
		delete(s.sources, endpoint)
		s.forgetRankLocked(endpoint, sc.Source)
		if ip, isIP := endpointIP(endpoint); isIP {
			if s.hosts[ip]--; s.hosts[ip] <= 0 {
				delete(s.hosts, ip)
			}
		}
	}
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

// forgetRankLocked drops endpoint's place among its server's ranks, unless
// another endpoint took it since, and the server with its last rank;
// s.mu must be held.
func (s *Subscriber) forgetRankLocked(endpoint string, src Source) {
	srv := s.servers[src.Server]
	if src.Server == "" || srv == nil || srv.ranks[src.Rank] != endpoint {
		return
	}
	delete(srv.ranks, src.Rank)
	if len(srv.ranks) == 0 {
		delete(s.servers, src.Server)
	}
}

// Reasons a data-parallel rank tag does not fit the pool, the reason
// label of kvgate_kvevents_rank_mismatches_total.
const (
	// mismatchStart: a connection's tags put the server's first rank
	// elsewhere than the server's other connections did (an endpoint
	// subscribed to another rank's socket, or pods of one server with
	// publisher ports not offset alike); the first one learned stands.
	mismatchStart = "start"
	// mismatchNoEndpoint: a batch tagged with a rank the server has no
	// endpoint for (its first rank not learned yet, as with a central
	// socket of one port, or more ranks than target ports); it stays on
	// the endpoint it arrived for.
	mismatchNoEndpoint = "no_endpoint"
)

// rankEndpoint is the endpoint a message arriving for ep belongs to: ep,
// unless its batch is tagged with another data-parallel rank of ep's
// server whose endpoint is in the pool, on ep's IP; "" (the drop counted)
// when the connection may not publish for that endpoint.
func (s *Subscriber) rankEndpoint(ep string, p *peer, payload []byte) string {
	tag, ok := kvwire.DataParallelRank(payload)
	if !ok || p.fixed && (p.src.Server == "" || p.ownTag == tag+1) {
		// Untagged, not a rank's, or this connection's own rank's tag,
		// checked already.
		return ep
	}
	s.mu.Lock()
	// A per-endpoint connection has the source it was opened for, as for
	// its replay; a central one the source of the endpoint its topic names.
	src := p.src
	if !p.fixed {
		if sc, ok := s.sources[ep]; ok {
			src = sc.Source
		}
	}
	srv := s.servers[src.Server]
	if src.Server == "" || srv == nil { // srv nil: removed meanwhile
		s.mu.Unlock()
		return ep
	}
	if p.offsetKnown {
		// The connection's publisher was offset by p.offset: its tag less
		// the offset is the global rank of the server's first rank.
		if start := tag - p.offset; !srv.startKnown && start >= 0 {
			srv.start, srv.startKnown = start, true
		} else if start != srv.start {
			s.mismatchLocked(srv, src.Server, ep, mismatchStart, "tag", tag, "connection_rank", p.offset, "first_rank", srv.start)
		}
	}
	place := tag - srv.start
	to, found := srv.ranks[place]
	if !found {
		s.mismatchLocked(srv, src.Server, ep, mismatchNoEndpoint, "tag", tag, "first_rank", srv.start, "first_rank_learned", srv.startKnown)
	}
	s.mu.Unlock()
	if !found || to == ep {
		if found && p.fixed {
			p.ownTag = tag + 1
		}
		return ep
	}
	ip, _ := endpointIP(ep)
	if toIP, ok := endpointIP(to); !ok || toIP != ip {
		return ep
	}
	if !p.fixed && !s.authorized(p.conn.RemoteAddr(), to) {
		s.m.dropped.WithLabelValues(dropUnauthorized).Inc()
		return ""
	}
	return to
}

// mismatchLocked counts a rank tag that does not fit server srv, and logs
// the first of each reason for the server (its endpoints are the pool's,
// so the log is bounded by the pool, not by the traffic); s.mu must be
// held.
func (s *Subscriber) mismatchLocked(srv *dpServer, server, ep, reason string, attrs ...any) {
	s.m.rankMismatches.WithLabelValues(reason).Inc()
	if srv.warned[reason] {
		return
	}
	if srv.warned == nil {
		srv.warned = make(map[string]bool)
	}
	srv.warned[reason] = true
	s.log.Warn("kv events: a data-parallel rank tag does not fit the server's endpoints; its ranks' blocks may be attributed to the wrong rank (vLLM tags and offsets ports by the global rank: pods whose ranks do not start at 0 must subtract their first rank from the configured KV-event ports)",
		append([]any{"reason", reason, "server", server, "endpoint", ep}, attrs...)...)
}

// replayFor is the replay socket address for a message: its per-endpoint
// source's, or the configured one of a central-socket endpoint.
func (s *Subscriber) replayFor(it item) string {
	if it.peer.fixed {
		return it.peer.src.Replay
	}
	return s.replayOf(it.endpoint)
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

// follow reads one endpoint's own publisher until ctx ends: it keeps a
// connection to src.Events (redialing with a bounded backoff), or, for an
// address vLLM's rule binds, listens there for it. A bound socket never
// dials.
func (s *Subscriber) follow(ctx context.Context, endpoint string, src Source) {
	addr := src.Events
	read := func(ctx context.Context, c *zmtp.Conn) { s.readFixed(ctx, c, endpoint, src) }
	if kvwire.Binds(addr) {
		srv, err := zmtp.Listen(ctx, addr, s.serverConfig(s.cfg.TLS), read)
		if err != nil {
			s.log.Error("kv events bind failed", "endpoint", endpoint, "addr", addr, "err", err)
			return
		}
		<-ctx.Done()
		_ = srv.Close()
		return
	}
	cfg := s.dialConfig(zmtp.SUB)
	cfg.Unreachable = func(err error) {
		s.m.unreachable.Inc()
		attrs := []any{"endpoint", endpoint, "addr", addr, "err", err}
		if src.Server != "" {
			// The likeliest cause with data parallelism: vLLM moved the
			// rank's socket by its global rank, not its place in the pod.
			attrs = append(attrs, "server", src.Server, "rank", src.Rank,
				"hint", "vLLM binds the configured port plus the global data-parallel rank: a pod whose ranks start at S must configure its KV-event ports less S")
		}
		s.log.Warn("kv events: the endpoint's publisher is unreachable; retrying", attrs...)
	}
	zmtp.Redial(ctx, addr, cfg, read)
}

// peer is one connection a stream can come from. Its reader marks it
// closed when the connection ends, before it returns.
type peer struct {
	id     uint64
	closed atomic.Bool
	conn   *zmtp.Conn
	mem    *connBudget
	// fixed: a per-endpoint source's connection, whose replay address
	// and rank are those of the source it was opened for (a source
	// replaced meanwhile does not lend it the new one's).
	fixed bool
	src   Source
	// offset is the data-parallel rank offset of the connection's
	// publisher when offsetKnown: a fixed connection's source's rank (its
	// socket is that rank's), a central one's bound port's place after
	// Config.Bind's when several are bound.
	offset      int
	offsetKnown bool
	// ownTag is 1 + the rank tag of a fixed connection's batches once
	// found to be its own rank's (0 before), read by its reader alone.
	ownTag int
}

// readFixed is read for a per-endpoint source.
func (s *Subscriber) readFixed(ctx context.Context, c *zmtp.Conn, endpoint string, src Source) {
	s.readPeer(ctx, c, endpoint, &peer{fixed: true, src: src, offset: src.Rank, offsetKnown: src.Server != ""})
}

// readPeer receives from one connection until it fails or ctx ends. A
// fixed endpoint names the sender of every message; otherwise the topic
// does, and the peer must be authorized for it.
func (s *Subscriber) readPeer(ctx context.Context, c *zmtp.Conn, endpoint string, p *peer) {
	p.id, p.conn, p.mem = s.peers.Add(1), c, &connBudget{g: &s.mem, max: s.cfg.PublisherMemory}
	c.SetAllocator(p.mem)
	s.m.conns.Inc()
	defer func() {
		p.closed.Store(true)
		s.m.conns.Dec()
	}()
	if err := c.SendSubscribe(time.Now().Add(s.cfg.HandshakeTimeout), nil); err != nil {
		return
	}
	rate := newBucket(s.cfg.PublisherRate, s.cfg.PublisherBytes, 2*s.cfg.MaxMessageSize)
	var lastTopic, lastEP string // the topic last authorized
	for {
		msg, err := c.Recv()
		if err != nil {
			if ctx.Err() == nil {
				s.m.closed.WithLabelValues(closeReason(err)).Inc()
				s.log.Debug("kv events connection ended", "endpoint", endpoint, "remote", c.RemoteAddr(), "err", err)
			}
			return
		}
		if ctx.Err() != nil {
			// The source was replaced or removed: what it still had
			// buffered is not the new source's to apply.
			p.mem.Release(msg.Reserved)
			return
		}
		size := 0
		for _, f := range msg.Frames {
			size += len(f)
		}
		if err := rate.take(ctx, size); err != nil {
			p.mem.Release(msg.Reserved)
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			p.mem.Release(msg.Reserved)
			s.m.dropped.WithLabelValues(dropBadFrames).Inc()
			continue
		}
		ep := endpoint
		if ep == "" {
			if topic := msg.Frames[0]; string(topic) == lastTopic && lastEP != "" && s.configured(lastEP) {
				// Parsed and authorized already; still in the pool.
				ep = lastEP
			} else if ep = s.topicEndpoint(topic, c); ep == "" {
				p.mem.Release(msg.Reserved)
				continue
			} else {
				lastTopic, lastEP = string(topic), ep
			}
		}
		if ep = s.rankEndpoint(ep, p, msg.Frames[2]); ep == "" {
			p.mem.Release(msg.Reserved)
			continue
		}
		it := item{endpoint: ep, seq: binary.BigEndian.Uint64(msg.Frames[1]), payload: msg.Frames[2], peer: p, reserved: msg.Reserved}
		select {
		case s.workerOf(ep).q <- it:
		default:
			p.mem.Release(msg.Reserved)
			s.m.dropped.WithLabelValues(dropQueueFull).Inc()
		}
	}
}

// topicEndpoint is the endpoint a central-socket topic names, or "" (the
// drop counted) when it names none of the pool or one the peer may not
// publish for.
func (s *Subscriber) topicEndpoint(topic []byte, c *zmtp.Conn) string {
	ep, _, ok := kvwire.ParseTopic(string(topic))
	if !ok {
		s.m.dropped.WithLabelValues(dropBadTopic).Inc()
		return ""
	}
	// Only the pool's endpoints may put entries in the index: a topic
	// names any address, and entries (and index ids) of endpoints nobody
	// will ever remove would only accumulate.
	if !s.configured(ep) {
		s.m.dropped.WithLabelValues(dropUnknownEndpoint).Inc()
		return ""
	}
	if !s.authorized(c.RemoteAddr(), ep) {
		s.m.dropped.WithLabelValues(dropUnauthorized).Inc()
		return ""
	}
	return ep
}

// closeReason labels why a connection ended.
func closeReason(err error) string {
	switch {
	case errors.Is(err, zmtp.ErrTooLarge):
		return "too_large"
	case errors.Is(err, zmtp.ErrBudget):
		return "memory"
	case errors.Is(err, zmtp.ErrProtocol):
		return "protocol"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	}
	return "closed"
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
	for _, srv := range s.central {
		_ = srv.Close()
	}
	s.wg.Wait()
	return nil
}
