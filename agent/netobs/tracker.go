package netobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// PeerStats is what the agent knows of the network to one peer address for
// one flow class. TCP classes come from the sockops program; NIXLClass from
// the agent's own transfers.
type PeerStats struct {
	Peer  netip.Addr
	Class string
	// Flows are the open connections (TCP classes; 0 for NIXLClass).
	Flows int
	// SRTT is the mean of the kernel's smoothed RTT over the flows that took
	// an RTT sample in the last poll (the last such mean when none did);
	// MinRTT is the lowest windowed minimum of the open flows.
	SRTT, MinRTT time.Duration
	Retransmits  uint64
	// BytesAcked counts bytes this node sent and the peer acknowledged (for
	// NIXLClass: bytes transferred).
	BytesAcked uint64
	// ThroughputBytesPerSec is, for TCP classes, the bytes acked per second
	// over the last poll interval; for NIXLClass a moving average of each
	// transfer's bytes over its duration (the achievable rate).
	ThroughputBytesPerSec float64
	Updated               time.Time

	// BytesReceived counts bytes this node received from the peer (TCP).
	BytesReceived uint64
	// Transfers, TransferFailures and TransferLatency (a moving average of
	// successful transfers' durations) are NIXLClass's.
	Transfers, TransferFailures uint64
	TransferLatency             time.Duration
}

// Config configures a Tracker. Zero values take the defaults.
type Config struct {
	// Classes are the tracked flow classes (default DefaultClasses).
	Classes []Class
	// CgroupPath is the cgroup v2 the sockops program attaches to; sockets
	// of processes below it are seen (default /sys/fs/cgroup/unified, else
	// /sys/fs/cgroup when that is the v2 root).
	CgroupPath string
	// MaxFlows sizes the BPF flow map (default 16384).
	MaxFlows int
	// MaxPeers bounds the peer label (default 256).
	MaxPeers int
	// Interval is how often the flow map is read (default 1 s).
	Interval time.Duration
	// PeerTTL forgets a peer with no open flow and no sample for this long
	// (default 5 min).
	PeerTTL time.Duration
	// DNSTTL is how long a transfer peer's name keeps its looked-up
	// address before the next transfer looks it up again (default 30 s): a
	// peer agent's pod may move to another address.
	DNSTTL time.Duration
	// Resolver looks the names up (default net.DefaultResolver).
	Resolver Resolver
	Logger   *slog.Logger
}

// Resolver is what the tracker needs of a DNS resolver (*net.Resolver).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

const (
	defaultMaxFlows = 16384
	defaultMaxPeers = 256
	defaultDNSTTL   = 30 * time.Second
	// dnsRetry bounds how soon a failed lookup is tried again (the last
	// good address, if any, serves meanwhile).
	dnsRetry = 5 * time.Second
	// dnsTimeout bounds one lookup, which the transfer's caller waits for.
	dnsTimeout = time.Second
	// ewmaWeight is the weight of a new transfer in the moving averages.
	ewmaWeight = 0.25
)

// ErrUnavailable is wrapped by Attach's error when the kernel or the
// process's permissions do not allow the eBPF programs.
var ErrUnavailable = errors.New("eBPF network tracking unavailable")

// Tracker aggregates flows and transfers per peer and class. Its methods
// are safe for concurrent use; Run is the one poll loop.
type Tracker struct {
	cfg     Config
	log     *slog.Logger
	classes []string // class id-1 -> name
	ports   []uint32

	bpf   *bpfSource // nil until Attach succeeds
	flows map[flowKey]*flowState
	gen   uint64
	last  time.Time // previous poll

	now       func() time.Time // the DNS cache's clock
	resolveMu sync.Mutex
	resolved  map[string]*dnsEntry // transfer peer host -> address, bounded by MaxPeers

	mu      sync.Mutex
	aggs    map[aggKey]*agg
	peerRef map[netip.Addr]int // aggregates per peer address
	counts  counters
}

type counters struct {
	peersDropped, flowsClosed, flowsEvicted, polls, pollErrors uint64
	mapEntries                                                 int
	bpfOpened, bpfEvents, bpfMissed                            uint64
	pollSeconds                                                float64
}

// dnsEntry is a transfer peer name's address.
type dnsEntry struct {
	ip      netip.Addr // the last good answer; invalid until one came
	expires time.Time  // when the next caller looks the name up again
	busy    bool       // a lookup is running (its caller updates the entry)
	used    time.Time  // for eviction when the cache is full
}

type aggKey struct {
	peer  netip.Addr
	class string
}

type agg struct {
	PeerStats
	rtt      histogram // per-flow SRTT, one observation per flow per poll with a new sample
	transfer histogram // NIXL transfer durations

	// scratch of the current poll
	open    int
	acked   uint64
	srttSum time.Duration
	srttN   int
	minRTT  time.Duration
}

// New checks cfg and returns a Tracker that records transfers; Attach adds
// the eBPF flows.
func New(cfg Config) (*Tracker, error) {
	if cfg.Classes == nil {
		cfg.Classes = DefaultClasses()
	}
	ports, err := portTable(cfg.Classes)
	if err != nil {
		return nil, err
	}
	if cfg.MaxFlows == 0 {
		cfg.MaxFlows = defaultMaxFlows
	}
	if cfg.MaxPeers == 0 {
		cfg.MaxPeers = defaultMaxPeers
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.PeerTTL == 0 {
		cfg.PeerTTL = 5 * time.Minute
	}
	if cfg.DNSTTL == 0 {
		cfg.DNSTTL = defaultDNSTTL
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	switch {
	case cfg.MaxFlows < 16 || cfg.MaxFlows > 1<<22:
		return nil, fmt.Errorf("netobs: MaxFlows %d out of range 16-%d", cfg.MaxFlows, 1<<22)
	case cfg.MaxPeers < 1:
		return nil, fmt.Errorf("netobs: MaxPeers %d must be positive", cfg.MaxPeers)
	case cfg.Interval < 10*time.Millisecond:
		return nil, fmt.Errorf("netobs: poll interval %v below 10ms", cfg.Interval)
	case cfg.PeerTTL < cfg.Interval:
		return nil, fmt.Errorf("netobs: peer TTL %v below the poll interval %v", cfg.PeerTTL, cfg.Interval)
	case cfg.DNSTTL < time.Second:
		return nil, fmt.Errorf("netobs: DNS TTL %v below 1s", cfg.DNSTTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := &Tracker{cfg: cfg, log: cfg.Logger.With("component", "netobs"), ports: ports,
		flows: map[flowKey]*flowState{}, now: time.Now, resolved: map[string]*dnsEntry{},
		aggs: map[aggKey]*agg{}, peerRef: map[netip.Addr]int{}}
	for _, c := range cfg.Classes {
		t.classes = append(t.classes, c.Name)
	}
	return t, nil
}

// Attached reports whether the eBPF programs are loaded.
func (t *Tracker) Attached() bool { return t.bpf != nil }

// Run polls the flow map every Interval and ages out idle peers, until ctx
// ends.
func (t *Tracker) Run(ctx context.Context) {
	tick := time.NewTicker(t.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			t.poll(now)
		}
	}
}

// Close detaches the eBPF programs; call it once Run has returned.
func (t *Tracker) Close() error {
	if t.bpf == nil {
		return nil
	}
	err := t.bpf.close()
	t.bpf = nil
	return err
}

// aggLocked returns the aggregate of (peer, class), creating it unless the
// peer bound is reached (then nil).
func (t *Tracker) aggLocked(peer netip.Addr, class string, now time.Time) *agg {
	k := aggKey{peer, class}
	if a := t.aggs[k]; a != nil {
		return a
	}
	if t.peerRef[peer] == 0 && len(t.peerRef) >= t.cfg.MaxPeers {
		t.counts.peersDropped++
		return nil
	}
	t.peerRef[peer]++
	a := &agg{PeerStats: PeerStats{Peer: peer, Class: class, Updated: now}}
	if class == NIXLClass {
		a.transfer = newHistogram(transferBuckets)
	} else {
		a.rtt = newHistogram(rttBuckets)
	}
	t.aggs[k] = a
	return a
}

// expireLocked forgets peers idle for PeerTTL.
func (t *Tracker) expireLocked(now time.Time) {
	for k, a := range t.aggs {
		if a.Flows == 0 && now.Sub(a.Updated) > t.cfg.PeerTTL {
			delete(t.aggs, k)
			if t.peerRef[k.peer]--; t.peerRef[k.peer] == 0 {
				delete(t.peerRef, k.peer)
			}
		}
	}
}

// ObserveTransfer records one NIXL transfer with the peer agent at addr
// (host:port or host): bytes moved in d, or a failure.
func (t *Tracker) ObserveTransfer(addr string, bytes uint64, d time.Duration, failed bool) {
	peer, ok := t.resolve(addr)
	if !ok {
		t.mu.Lock()
		t.counts.peersDropped++
		t.mu.Unlock()
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.aggLocked(peer, NIXLClass, now)
	if a == nil {
		return
	}
	a.Updated = now
	if failed {
		a.TransferFailures++
		return
	}
	a.Transfers++
	a.BytesAcked += bytes
	a.transfer.observe(d.Seconds())
	rate := 0.0
	if d > 0 {
		rate = float64(bytes) / d.Seconds()
	}
	if a.Transfers == 1 {
		a.TransferLatency, a.ThroughputBytesPerSec = d, rate
	} else {
		a.TransferLatency = time.Duration(ewmaWeight*float64(d) + (1-ewmaWeight)*float64(a.TransferLatency))
		a.ThroughputBytesPerSec = ewmaWeight*rate + (1-ewmaWeight)*a.ThroughputBytesPerSec
	}
}

// resolve turns a peer agent's address into an IP. A name's answer is
// kept for DNSTTL, and kept past it while a new lookup fails; at most
// MaxPeers names are kept, the least recently used making room.
func (t *Tracker) resolve(addr string) (netip.Addr, bool) {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap(), true
	}
	now := t.now()
	t.resolveMu.Lock()
	e := t.resolved[host]
	if e == nil {
		if len(t.resolved) >= t.cfg.MaxPeers {
			t.evictNameLocked()
		}
		e = &dnsEntry{}
		t.resolved[host] = e
	}
	e.used = now
	if e.busy || now.Before(e.expires) {
		// Fresh, or another caller is looking it up: its last answer.
		ip := e.ip
		t.resolveMu.Unlock()
		return ip, ip.IsValid()
	}
	e.busy = true
	t.resolveMu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
	ips, err := t.cfg.Resolver.LookupNetIP(ctx, "ip", host)
	cancel()
	if err == nil && len(ips) == 0 {
		err = fmt.Errorf("no address")
	}
	t.resolveMu.Lock()
	defer t.resolveMu.Unlock()
	e.busy = false
	if err != nil {
		e.expires = now.Add(min(t.cfg.DNSTTL, dnsRetry))
		t.log.Debug("transfer peer not resolved", "peer", addr, "err", err, "last", e.ip)
		return e.ip, e.ip.IsValid()
	}
	e.ip, e.expires = ips[0].Unmap(), now.Add(t.cfg.DNSTTL)
	return e.ip, true
}

// evictNameLocked drops the least recently used name whose lookup is not
// running (one whose is, is dropped when none other is left: its caller
// then updates an entry no longer in the cache).
func (t *Tracker) evictNameLocked() {
	var victim string
	var oldest *dnsEntry
	for h, e := range t.resolved {
		if oldest == nil || (oldest.busy && !e.busy) || (oldest.busy == e.busy && e.used.Before(oldest.used)) {
			victim, oldest = h, e
		}
	}
	delete(t.resolved, victim)
}

// Peers returns every tracked (peer, class), sorted by peer then class.
func (t *Tracker) Peers() []PeerStats {
	t.mu.Lock()
	out := make([]PeerStats, 0, len(t.aggs))
	for _, a := range t.aggs {
		out = append(out, a.PeerStats)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b PeerStats) int {
		if c := a.Peer.Compare(b.Peer); c != 0 {
			return c
		}
		return cmp.Compare(a.Class, b.Class)
	})
	return out
}
