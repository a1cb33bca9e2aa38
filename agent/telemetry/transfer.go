package telemetry

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// DefaultMaxPeers bounds TransferTracker's map when its MaxPeers is 0.
const DefaultMaxPeers = 1024

// TransferTracker turns the agent's NIXL READ timings into per-peer
// statistics (class ClassNIXL): where KV moves over RDMA, TCP probes see
// nothing and these timings are the signal. SRTT is the smoothed READ
// duration (gain 1/8, as TCP's), MinRTT the shortest, throughput the
// smoothed bytes per second of the READs (gain 1/4), BytesAcked the bytes
// read; Retransmits stays 0 (a failed READ is not retried by NIXL).
//
// The zero value is not usable; call NewTransferTracker.
type TransferTracker struct {
	mu    sync.Mutex
	max   int
	now   func() time.Time
	peers map[netip.Addr]*transferPeer
}

type transferPeer struct {
	stats PeerStats
	ports []string // the peer's agent addresses seen (Flows), at most maxPorts
}

const maxPorts = 16

// NewTransferTracker returns a tracker keeping at most maxPeers peers (0:
// DefaultMaxPeers); now is its clock (nil: time.Now).
func NewTransferTracker(maxPeers int, now func() time.Time) *TransferTracker {
	if maxPeers <= 0 {
		maxPeers = DefaultMaxPeers
	}
	if now == nil {
		now = time.Now
	}
	return &TransferTracker{max: maxPeers, now: now, peers: map[netip.Addr]*transferPeer{}}
}

// Observe records one completed READ of n bytes from the agent at peer
// ("host:port", the address PullBlocks names) that took d. Addresses that
// are not IP:port (a DNS name) are dropped: the picker resolves nodes by
// IP.
func (t *TransferTracker) Observe(peer string, n uint64, d time.Duration) {
	host, _, err := net.SplitHostPort(peer)
	if err != nil {
		return
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || d <= 0 {
		return
	}
	ip = ip.Unmap()
	rate := float64(n) / d.Seconds()
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.peers[ip]
	if !ok {
		if len(t.peers) >= t.max {
			t.evictOldestLocked()
		}
		p = &transferPeer{stats: PeerStats{Peer: ip, Class: ClassNIXL, SRTT: d, MinRTT: d, ThroughputBytesPerSec: rate}}
		t.peers[ip] = p
	} else {
		s := &p.stats
		s.SRTT += (d - s.SRTT) / 8
		s.MinRTT = min(s.MinRTT, d)
		s.ThroughputBytesPerSec += (rate - s.ThroughputBytesPerSec) / 4
	}
	if !slices.Contains(p.ports, peer) && len(p.ports) < maxPorts {
		p.ports = append(p.ports, peer)
	}
	p.stats.Flows = len(p.ports)
	p.stats.BytesAcked += n
	p.stats.Updated = t.now()
}

func (t *TransferTracker) evictOldestLocked() {
	var oldest netip.Addr
	var at time.Time
	for ip, p := range t.peers {
		if !oldest.IsValid() || p.stats.Updated.Before(at) {
			oldest, at = ip, p.stats.Updated
		}
	}
	delete(t.peers, oldest)
}

// Peers implements PeerSource: a copy, sorted by address.
func (t *TransferTracker) Peers() []PeerStats {
	t.mu.Lock()
	out := make([]PeerStats, 0, len(t.peers))
	for _, p := range t.peers {
		out = append(out, p.stats)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b PeerStats) int { return a.Peer.Compare(b.Peer) })
	return out
}
