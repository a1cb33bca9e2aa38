package netobs

import (
	"encoding/binary"
	"net/netip"
	"time"
)

// flowKey is the BPF map's key: family, ports, addresses.
type flowKey = netobsFlowKey

// flowState is the last values seen of one flow, to turn the kernel's
// cumulative counters into deltas.
type flowState struct {
	agg  *agg // nil: its peer is beyond MaxPeers
	last netobsFlow
	gen  uint64
}

const (
	afInet  = 2
	afInet6 = 10
)

// remoteAddr is the flow's peer address.
func remoteAddr(k *flowKey) (netip.Addr, bool) {
	var b [16]byte
	for i, w := range k.Raddr {
		binary.NativeEndian.PutUint32(b[4*i:], w) // stored in network order
	}
	switch k.Family {
	case afInet:
		return netip.AddrFrom4([4]byte(b[:4])), true
	case afInet6:
		return netip.AddrFrom16(b).Unmap(), true
	}
	return netip.Addr{}, false
}

// since returns cur-prev, or cur when the counter went back (a new
// connection reusing an evicted flow's key).
func since[T uint32 | uint64](cur, prev T) T {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// account folds one poll's flow map into the aggregates and returns the
// keys of closed flows, which the caller deletes from the map.
func (t *Tracker) account(now time.Time, entries []flowEntry) []flowKey {
	t.gen++
	t.mu.Lock()
	defer t.mu.Unlock()
	elapsed := t.cfg.Interval
	if !t.last.IsZero() && now.After(t.last) {
		elapsed = now.Sub(t.last)
	}
	t.last = now
	for _, a := range t.aggs {
		a.open, a.acked, a.srttSum, a.srttN, a.minRTT = 0, 0, 0, 0, 0
	}
	var closed []flowKey
	for i := range entries {
		k, v := &entries[i].key, &entries[i].val
		fs := t.flows[*k]
		if fs == nil {
			fs = &flowState{}
			if peer, ok := remoteAddr(k); ok && v.ClassId >= 1 && int(v.ClassId) <= len(t.classes) {
				fs.agg = t.aggLocked(peer, t.classes[v.ClassId-1], now)
			}
			t.flows[*k] = fs
		}
		fs.gen = t.gen
		if a := fs.agg; a != nil {
			a.Retransmits += uint64(since(v.Retrans, fs.last.Retrans))
			acked := since(v.BytesAcked, fs.last.BytesAcked)
			a.BytesAcked += acked
			a.acked += acked
			a.BytesReceived += since(v.BytesReceived, fs.last.BytesReceived)
			if v.RttSamples != fs.last.RttSamples && v.SrttUs > 0 {
				srtt := time.Duration(v.SrttUs) * time.Microsecond
				a.rtt.observe(srtt.Seconds())
				a.srttSum += srtt
				a.srttN++
				a.Updated = now
			}
			if v.Closed == 0 {
				a.open++
				if m := time.Duration(v.MinRttUs) * time.Microsecond; m > 0 && (a.minRTT == 0 || m < a.minRTT) {
					a.minRTT = m
				}
			}
		}
		fs.last = *v
		if v.Closed != 0 {
			closed = append(closed, *k)
			delete(t.flows, *k)
			t.counts.flowsClosed++
		}
	}
	for k, fs := range t.flows {
		if fs.gen != t.gen { // evicted from the LRU map before it closed
			delete(t.flows, k)
			t.counts.flowsEvicted++
		}
	}
	for _, a := range t.aggs {
		if a.Class == NIXLClass {
			continue
		}
		a.Flows = a.open
		if a.srttN > 0 {
			a.SRTT = a.srttSum / time.Duration(a.srttN)
		}
		if a.open > 0 {
			a.MinRTT = a.minRTT
		}
		a.ThroughputBytesPerSec = float64(a.acked) / elapsed.Seconds()
		if a.acked > 0 {
			a.Updated = now
		}
	}
	t.expireLocked(now)
	t.counts.mapEntries = len(entries) - len(closed)
	return closed
}

// poll reads the flow map once and accounts it.
func (t *Tracker) poll(now time.Time) {
	var entries []flowEntry
	var err error
	if t.bpf != nil {
		entries, err = t.bpf.read()
	}
	if err != nil {
		t.mu.Lock()
		t.counts.pollErrors++
		t.mu.Unlock()
		t.log.Warn("reading the flow map", "err", err)
		return
	}
	closed := t.account(now, entries)
	if t.bpf == nil {
		return
	}
	t.bpf.remove(closed)
	opened, events, missed := t.bpf.stats()
	t.mu.Lock()
	t.counts.polls++
	t.counts.bpfOpened, t.counts.bpfEvents, t.counts.bpfMissed = opened, events, missed
	t.counts.pollSeconds += time.Since(now).Seconds()
	t.mu.Unlock()
}
