package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/extproc/scheduling"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// ServiceKey is the Handle.Services key of the picker's Store.
const ServiceKey = "kvgate.telemetry"

// FromHandle returns the picker's Store, when it runs one.
func FromHandle(h *scheduling.Handle) (*Store, bool) {
	return scheduling.Service[*Store](h, ServiceKey)
}

// Per-report bounds: what an agent sends beyond them is dropped.
const (
	maxAddresses       = 64
	maxGPUs            = 64
	maxEndpointsPerGPU = 64
)

// Config configures a Store.
type Config struct {
	// Agents are agent gRPC addresses ("host:port") subscribed to from the
	// start; SetAgents replaces the discovered ones.
	Agents []string
	// Interval is the report interval asked of the agents (default 1 s).
	Interval time.Duration
	// StaleAfter is the age at which a node's report stops counting
	// (default 5 intervals, at least 5 s).
	StaleAfter time.Duration
	// PeerMaxAge is the age at which one peer measurement stops counting
	// (default 5 min).
	PeerMaxAge time.Duration
	// MaxAgents bounds the subscriptions (default 4096).
	MaxAgents int
	// MaxPeersPerNode bounds the peers kept of one report (default 1024).
	MaxPeersPerNode int
	// DialOptions are added to every agent connection (default:
	// plaintext).
	DialOptions []grpc.DialOption
	Now         func() time.Time
	Log         *slog.Logger
}

// Store holds the latest telemetry of every node.
type Store struct {
	cfg   Config
	wake  chan struct{}
	stats struct {
		agents, streaming atomic.Int64
		reports, failures atomic.Uint64
	}

	// parsed and nParsed remember endpoint strings parsed (addrOf).
	parsed  sync.Map
	nParsed atomic.Int64

	mu         sync.RWMutex
	nodes      map[string]*node
	addrNode   map[netip.Addr]string
	endpoints  map[string][]gpuRef // "host:port" or "ip" → GPUs
	discovered []string            // SetAgents' latest set
}

type node struct {
	name     string
	agent    string
	received time.Time
	report   *telemetryv1.Report
	addrs    []netip.Addr
	peers    map[netip.Addr][]*telemetryv1.Peer
	retrans  map[peerKey]float64
	epKeys   []string
}

type gpuRef struct {
	node string
	gpu  *telemetryv1.GPU
}

// New returns a Store; Run subscribes.
func New(cfg Config) (*Store, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = max(5*cfg.Interval, 5*time.Second)
	}
	if cfg.PeerMaxAge <= 0 {
		cfg.PeerMaxAge = 5 * time.Minute
	}
	if cfg.MaxAgents <= 0 {
		cfg.MaxAgents = 4096
	}
	if cfg.MaxPeersPerNode <= 0 {
		cfg.MaxPeersPerNode = 1024
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cfg.Log = cfg.Log.With("component", "telemetry")
	for _, a := range cfg.Agents {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("telemetry agent %q: %w", a, err)
		}
	}
	if len(cfg.Agents) > cfg.MaxAgents {
		return nil, fmt.Errorf("telemetry: %d agents, at most %d", len(cfg.Agents), cfg.MaxAgents)
	}
	return &Store{cfg: cfg, wake: make(chan struct{}, 1), nodes: map[string]*node{},
		addrNode: map[netip.Addr]string{}, endpoints: map[string][]gpuRef{}}, nil
}

// SetAgents replaces the discovered agents (the static ones stay); it
// never blocks.
func (s *Store) SetAgents(addrs []string) {
	s.mu.Lock()
	s.discovered = slices.Clone(addrs)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run subscribes to the agents until ctx ends, following SetAgents, and
// drops stale nodes.
func (s *Store) Run(ctx context.Context) {
	type sub struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	subs := map[string]sub{}
	defer func() {
		for _, sb := range subs {
			sb.cancel()
			<-sb.done
		}
	}()
	janitor := time.NewTicker(max(s.cfg.StaleAfter/2, 10*time.Millisecond))
	defer janitor.Stop()
	reconcile := func() {
		s.mu.RLock()
		want := map[string]bool{}
		for _, a := range append(slices.Clone(s.cfg.Agents), s.discovered...) {
			if len(want) < s.cfg.MaxAgents {
				want[a] = true
			}
		}
		s.mu.RUnlock()
		for a, sb := range subs {
			if !want[a] {
				sb.cancel()
				<-sb.done
				delete(subs, a)
				s.forgetAgent(a)
			}
		}
		defer func() { s.stats.agents.Store(int64(len(subs))) }()
		for a := range want {
			if _, ok := subs[a]; !ok {
				sctx, cancel := context.WithCancel(ctx)
				sb := sub{cancel: cancel, done: make(chan struct{})}
				subs[a] = sb
				go func() {
					defer close(sb.done)
					s.subscribe(sctx, a)
				}()
			}
		}
	}
	reconcile()
	defer s.stats.agents.Store(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
			reconcile()
		case <-janitor.C:
			s.dropStale()
		}
	}
}

// subscribe keeps one agent's stream open, reconnecting with backoff.
func (s *Store) subscribe(ctx context.Context, addr string) {
	backoff := 100 * time.Millisecond
	var lastErr string
	for ctx.Err() == nil {
		got, err := s.watchOnce(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		s.stats.failures.Add(1)
		if got {
			backoff = 100 * time.Millisecond
		}
		if msg := fmt.Sprint(err); msg != lastErr {
			s.cfg.Log.Warn("telemetry stream from agent ended; reconnecting", "agent", addr, "err", err)
			lastErr = msg
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// watchOnce runs one stream; got reports whether any report arrived.
func (s *Store) watchOnce(ctx context.Context, addr string) (got bool, err error) {
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, s.cfg.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := telemetryv1.NewTelemetryClient(conn).Watch(ctx, &telemetryv1.WatchRequest{IntervalMs: uint32(s.cfg.Interval.Milliseconds())})
	if err != nil {
		return false, err
	}
	// A live agent sends every interval: a stream silent for StaleAfter is
	// dead (a half-open connection) and is replaced.
	watchdog := time.AfterFunc(s.cfg.StaleAfter, cancel)
	defer watchdog.Stop()
	defer func() {
		if got {
			s.stats.streaming.Add(-1)
		}
	}()
	for {
		r, err := stream.Recv()
		if err != nil {
			return got, err
		}
		watchdog.Reset(s.cfg.StaleAfter)
		if !got {
			s.stats.streaming.Add(1)
		}
		got = true
		s.stats.reports.Add(1)
		s.apply(addr, r)
	}
}

// apply replaces the node's report and its index entries.
func (s *Store) apply(agent string, r *telemetryv1.Report) {
	if r.Node == "" {
		return
	}
	n := &node{name: r.Node, agent: agent, received: s.cfg.Now(), report: r, peers: map[netip.Addr][]*telemetryv1.Peer{}}
	for _, a := range r.Addresses[:min(len(r.Addresses), maxAddresses)] {
		if ip, err := netip.ParseAddr(a); err == nil {
			n.addrs = append(n.addrs, ip.Unmap())
		}
	}
	kept := 0
	for _, p := range r.Peers {
		ip, err := netip.ParseAddr(p.Address)
		if err != nil || kept >= s.cfg.MaxPeersPerNode {
			continue
		}
		ip = ip.Unmap()
		n.peers[ip] = append(n.peers[ip], p)
		kept++
	}
	r.Gpus = r.Gpus[:min(len(r.Gpus), maxGPUs)]
	for _, g := range r.Gpus {
		g.Endpoints = g.Endpoints[:min(len(g.Endpoints), maxEndpointsPerGPU)]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.nodes[r.Node]; ok {
		n.retrans = retransRates(old, n)
		if old.agent != agent {
			s.cfg.Log.Warn("two agents report the same node; the latest wins", "node", r.Node, "agent", agent, "other", old.agent)
		}
		s.unindexLocked(old)
	}
	for _, ip := range n.addrs {
		s.addrNode[ip] = n.name
	}
	for _, g := range r.Gpus {
		for _, e := range g.Endpoints {
			key := endpointKey(e)
			if key == "" {
				continue
			}
			s.endpoints[key] = append(s.endpoints[key], gpuRef{node: n.name, gpu: g})
			n.epKeys = append(n.epKeys, key)
		}
	}
	s.nodes[n.name] = n
}

// endpointKey normalizes "host:port" and bare IPs; "" for neither.
func endpointKey(e string) string {
	if ap, err := netip.ParseAddrPort(e); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
	}
	if ip, err := netip.ParseAddr(e); err == nil {
		return ip.Unmap().String()
	}
	return ""
}

func (s *Store) unindexLocked(n *node) {
	for _, ip := range n.addrs {
		if s.addrNode[ip] == n.name {
			delete(s.addrNode, ip)
		}
	}
	for _, key := range n.epKeys {
		refs := slices.DeleteFunc(s.endpoints[key], func(r gpuRef) bool { return r.node == n.name })
		if len(refs) == 0 {
			delete(s.endpoints, key)
		} else {
			s.endpoints[key] = refs
		}
	}
	delete(s.nodes, n.name)
}

func (s *Store) forgetAgent(agent string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		if n.agent == agent {
			s.unindexLocked(n)
		}
	}
}

func (s *Store) dropStale() {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		if now.Sub(n.received) > s.cfg.StaleAfter {
			s.unindexLocked(n)
		}
	}
}

// freshLocked returns the node unless it is missing or stale.
func (s *Store) freshLocked(name string, now time.Time) *node {
	n := s.nodes[name]
	if n == nil || now.Sub(n.received) > s.cfg.StaleAfter {
		return nil
	}
	return n
}

// Nodes lists the nodes with fresh telemetry, sorted.
func (s *Store) Nodes() []string {
	now := s.cfg.Now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for name := range s.nodes {
		if s.freshLocked(name, now) != nil {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
