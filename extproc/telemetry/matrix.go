package telemetry

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Path is the network between two nodes as their agents measured it.
type Path struct {
	// FromNode measured; ToNode is the peer's node, or its IP when no
	// agent reports that address.
	FromNode, ToNode string
	// ThroughputBytesPerSec is the best achieved rate over the flow
	// classes measured (what a KV transfer can expect), RTT the smallest
	// smoothed RTT, MinRTT the smallest minimum.
	ThroughputBytesPerSec float64
	RTT, MinRTT           time.Duration
	// RetransmitsPerSec is the TCP retransmit rate between the last two
	// reports (0 until two arrived).
	RetransmitsPerSec float64
	Classes           []string
	Updated           time.Time
}

// peerKey names one peer measurement across a node's reports.
type peerKey struct {
	ip    netip.Addr
	class string
}

// retransRates derives per-peer retransmit rates from two reports.
func retransRates(old, cur *node) map[peerKey]float64 {
	if old == nil {
		return nil
	}
	dt := cur.received.Sub(old.received).Seconds()
	if dt <= 0 {
		return nil
	}
	var out map[peerKey]float64 // allocated for the first peer with retransmits
	for ip, ps := range cur.peers {
		for _, p := range ps {
			if p.Retransmits == 0 {
				continue
			}
			for _, q := range old.peers[ip] {
				if q.Class == p.Class && p.Retransmits >= q.Retransmits {
					if out == nil {
						out = map[peerKey]float64{}
					}
					out[peerKey{ip, p.Class}] = float64(p.Retransmits-q.Retransmits) / dt
				}
			}
		}
	}
	return out
}

// NodeOf resolves an endpoint ("host:port") to the node it runs on.
func (s *Store) NodeOf(endpoint string) (string, bool) {
	now := s.cfg.Now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	n, _ := s.nodeOfLocked(endpoint, now)
	if n == nil {
		return "", false
	}
	return n.name, true
}

// nodeOfLocked returns the endpoint's fresh node (nil when unknown) and
// its host IP (invalid when the address has none).
func (s *Store) nodeOfLocked(endpoint string, now time.Time) (*node, netip.Addr) {
	a := s.addrOf(endpoint)
	for _, k := range a.keys() {
		for _, r := range s.endpoints[k] {
			if n := s.freshLocked(r.node, now); n != nil {
				return n, a.ip
			}
		}
	}
	if a.ip.IsValid() {
		if name, ok := s.addrNode[a.ip]; ok {
			return s.freshLocked(name, now), a.ip
		}
	}
	return nil, a.ip
}

// endpointAddr is what a lookup needs of an endpoint string: its host IP
// (unmapped; invalid when it names none) and the keys reports file GPUs
// under (endpointKey, then the IP alone; "" for none).
type endpointAddr struct {
	ip         netip.Addr
	key, ipKey string
}

// keys are the endpoint's keys in s.endpoints, most specific first.
func (a *endpointAddr) keys() [2]string { return [2]string{a.key, a.ipKey} }

func parseEndpoint(endpoint string) *endpointAddr {
	var ip netip.Addr
	if host, _, err := net.SplitHostPort(endpoint); err == nil {
		ip, _ = netip.ParseAddr(strings.Trim(host, "[]"))
	} else {
		ip, _ = netip.ParseAddr(endpoint)
	}
	a := &endpointAddr{ip: ip.Unmap(), key: endpointKey(endpoint)}
	if a.ip.IsValid() {
		a.ipKey = a.ip.String()
	}
	return a
}

// maxParsed bounds the endpoint strings whose parse is remembered; past
// it they are forgotten and parsed again.
const maxParsed = 1 << 14

// addrOf is endpoint parsed, once per endpoint string: the picker asks of
// the same few addresses for every candidate of every request, and
// parsing and formatting them was most of a lookup.
func (s *Store) addrOf(endpoint string) *endpointAddr {
	if v, ok := s.parsed.Load(endpoint); ok {
		return v.(*endpointAddr)
	}
	a := parseEndpoint(endpoint)
	if s.nParsed.Add(1) > maxParsed {
		s.parsed.Clear()
		s.nParsed.Store(1)
	}
	s.parsed.Store(endpoint, a)
	return a
}

// PathBetween is the network from the node of fromEndpoint to the node of
// toEndpoint ("host:port" each): the achievable throughput and RTT either
// agent measured of the other. ok is false when no fresh measurement
// covers the pair, or both endpoints are on one node (no network between
// them).
func (s *Store) PathBetween(fromEndpoint, toEndpoint string) (bytesPerSecond float64, rtt time.Duration, ok bool) {
	p, ok := s.pathBetween(fromEndpoint, toEndpoint, false)
	return p.ThroughputBytesPerSec, p.RTT, ok
}

// PathStats is PathBetween with every figure of the pair.
func (s *Store) PathStats(fromEndpoint, toEndpoint string) (Path, bool) {
	return s.pathBetween(fromEndpoint, toEndpoint, true)
}

// pathBetween is the pair's Path; without detail its ToNode and Classes of
// each measurement are left out (PathBetween reports neither), which
// keeps the lookup free of allocations.
func (s *Store) pathBetween(from, to string, detail bool) (Path, bool) {
	now := s.cfg.Now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	fn, fip := s.nodeOfLocked(from, now)
	tn, tip := s.nodeOfLocked(to, now)
	if fn != nil && fn == tn {
		return Path{}, false
	}
	var out Path
	found := false
	// What the source's agent saw of the destination, then the reverse
	// (the decoder's agent times the READs of a P/D transfer).
	var fromIPs, toIPs [8]netip.Addr
	for _, dir := range [...]struct {
		measurer *node
		peerIPs  []netip.Addr
	}{{fn, targetIPs(toIPs[:0], tn, tip)}, {tn, targetIPs(fromIPs[:0], fn, fip)}} {
		if dir.measurer == nil {
			continue
		}
		if p, ok := s.measuredLocked(dir.measurer, dir.peerIPs, now, detail); ok {
			if !found {
				out = p
			} else {
				out = merge(out, p)
			}
			found = true
		}
	}
	if !found {
		return Path{}, false
	}
	if fn != nil {
		out.FromNode = fn.name
	}
	if tn != nil {
		out.ToNode = tn.name
	}
	return out, true
}

func targetIPs(out []netip.Addr, n *node, ip netip.Addr) []netip.Addr {
	if ip.IsValid() {
		out = append(out, ip)
	}
	if n != nil {
		for _, a := range n.addrs {
			if a != ip {
				out = append(out, a)
			}
		}
	}
	return out
}

// measuredLocked folds m's fresh measurements of any of ips into a Path;
// detail as for pathBetween.
func (s *Store) measuredLocked(m *node, ips []netip.Addr, now time.Time, detail bool) (Path, bool) {
	var out Path
	found := false
	for _, ip := range ips {
		for _, p := range m.peers[ip] {
			at := m.received
			if p.UpdatedUnixNano > 0 {
				at = time.Unix(0, p.UpdatedUnixNano)
			}
			if now.Sub(at) > s.cfg.PeerMaxAge {
				continue
			}
			one := Path{FromNode: m.name, ThroughputBytesPerSec: p.ThroughputBytesPerSec,
				RTT: time.Duration(p.SrttUs) * time.Microsecond, MinRTT: time.Duration(p.MinRttUs) * time.Microsecond,
				RetransmitsPerSec: m.retrans[peerKey{ip, p.Class}], Updated: at}
			if detail {
				one.ToNode, one.Classes = ip.String(), []string{p.Class}
			}
			if !found {
				out = one
			} else {
				out = merge(out, one)
			}
			found = true
		}
	}
	return out, found
}

// merge keeps the best of two measurements of one pair.
func merge(a, b Path) Path {
	a.ThroughputBytesPerSec = max(a.ThroughputBytesPerSec, b.ThroughputBytesPerSec)
	a.RTT = minPositive(a.RTT, b.RTT)
	a.MinRTT = minPositive(a.MinRTT, b.MinRTT)
	a.RetransmitsPerSec = max(a.RetransmitsPerSec, b.RetransmitsPerSec)
	for _, c := range b.Classes {
		if !slices.Contains(a.Classes, c) {
			a.Classes = append(a.Classes, c)
		}
	}
	if b.Updated.After(a.Updated) {
		a.Updated = b.Updated
	}
	return a
}

func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}

// Matrix lists every fresh node-pair measurement, one Path per (measuring
// node, peer node), sorted.
func (s *Store) Matrix() []Path {
	now := s.cfg.Now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	byPair := map[[2]string]Path{}
	for name := range s.nodes {
		m := s.freshLocked(name, now)
		if m == nil {
			continue
		}
		for ip := range m.peers {
			p, ok := s.measuredLocked(m, []netip.Addr{ip}, now, true)
			if !ok {
				continue
			}
			if peer, ok := s.addrNode[ip]; ok && s.freshLocked(peer, now) != nil {
				p.ToNode = peer
			}
			k := [2]string{p.FromNode, p.ToNode}
			if old, ok := byPair[k]; ok {
				p = merge(old, p)
			}
			byPair[k] = p
		}
	}
	out := make([]Path, 0, len(byPair))
	for _, p := range byPair {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Path) int {
		if c := strings.Compare(a.FromNode, b.FromNode); c != 0 {
			return c
		}
		return strings.Compare(a.ToNode, b.ToNode)
	})
	return out
}
