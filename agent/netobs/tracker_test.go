package netobs

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
)

func TestParseClass(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Class
		err  string
	}{
		{in: "kv=20000-20999", want: Class{Name: "kv", Ranges: []PortRange{{20000, 20999}}}},
		{in: "picker=9002,5557", want: Class{Name: "picker", Ranges: []PortRange{{9002, 9002}, {5557, 5557}}}},
		{in: "a_1= 80 - 81 ,443", want: Class{Name: "a_1", Ranges: []PortRange{{80, 81}, {443, 443}}}},
		{in: "kv", err: "want name=port"},
		{in: "=80", err: "want name=port"},
		{in: "Kv=80", err: "[a-z0-9_]"},
		{in: "kv=0", err: "want 1-65535"},
		{in: "kv=70000", err: "want 1-65535"},
		{in: "kv=90-80", err: "is empty"},
		{in: "kv=80,", err: "want 1-65535"},
		{in: "kv_nixl=80", err: "reserved"},
	} {
		got, err := ParseClass(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestPortTable(t *testing.T) {
	tb, err := portTable([]Class{{Name: "a", Ranges: []PortRange{{10, 20}}}, {Name: "b", Ranges: []PortRange{{15, 30}}}})
	if err != nil {
		t.Fatal(err)
	}
	for port, want := range map[int]uint32{9: 0, 10: 1, 20: 1, 21: 2, 30: 2, 31: 0, 65535: 0} {
		if tb[port] != want {
			t.Errorf("port %d: class %d, want %d (the earlier class wins overlaps)", port, tb[port], want)
		}
	}
	for _, bad := range [][]Class{nil, {{Name: "a", Ranges: []PortRange{{1, 1}}}, {Name: "a", Ranges: []PortRange{{2, 2}}}}} {
		if _, err := portTable(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	if _, err := New(Config{Interval: time.Millisecond}); err == nil {
		t.Error("a 1ms poll interval was accepted")
	}
}

// key builds a flow key as the BPF program stores it.
func key(remote string, lport, rport uint32) flowKey {
	a := netip.MustParseAddr(remote)
	k := flowKey{Lport: lport, Rport: rport}
	if a.Is4() {
		k.Family = afInet
		b := a.As4()
		k.Raddr[0] = binary.NativeEndian.Uint32(b[:])
	} else {
		k.Family = afInet6
		b := a.As16()
		for i := range 4 {
			k.Raddr[i] = binary.NativeEndian.Uint32(b[4*i:])
		}
	}
	return k
}

func newTestTracker(t *testing.T, cfg Config) *Tracker {
	t.Helper()
	if cfg.Classes == nil {
		cfg.Classes = []Class{{Name: "kv", Ranges: []PortRange{{7000, 7000}}}, {Name: "web", Ranges: []PortRange{{80, 80}}}}
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func peer(t *testing.T, tr *Tracker, addr, class string) PeerStats {
	t.Helper()
	for _, p := range tr.Peers() {
		if p.Peer == netip.MustParseAddr(addr) && p.Class == class {
			return p
		}
	}
	t.Fatalf("no peer %s/%s in %+v", addr, class, tr.Peers())
	return PeerStats{}
}

// TestAccount drives the aggregation with flow-map snapshots: deltas of
// cumulative counters, SRTT from flows with new samples, closed and
// evicted flows, throughput over the interval, expiry.
func TestAccount(t *testing.T) {
	tr := newTestTracker(t, Config{PeerTTL: 10 * time.Second})
	t0 := time.Unix(1000, 0)
	f1, f2, f3 := key("10.0.0.2", 40000, 7000), key("10.0.0.2", 40001, 7000), key("2001:db8::9", 80, 50000)
	closed := tr.account(t0, []flowEntry{
		{f1, netobsFlow{SrttUs: 10000, MinRttUs: 9000, RttSamples: 3, BytesAcked: 1000, Retrans: 1, ClassId: 1}},
		{f2, netobsFlow{SrttUs: 30000, MinRttUs: 8000, RttSamples: 1, BytesAcked: 500, ClassId: 1}},
		{f3, netobsFlow{SrttUs: 500, MinRttUs: 400, RttSamples: 1, BytesReceived: 7, ClassId: 2}},
	})
	if len(closed) != 0 {
		t.Fatalf("closed %v", closed)
	}
	p := peer(t, tr, "10.0.0.2", "kv")
	if p.Flows != 2 || p.SRTT != 20*time.Millisecond || p.MinRTT != 8*time.Millisecond || p.BytesAcked != 1500 || p.Retransmits != 1 {
		t.Fatalf("first poll: %+v", p)
	}
	if p.ThroughputBytesPerSec != 1500 { // 1 s default interval on the first poll
		t.Fatalf("throughput %v", p.ThroughputBytesPerSec)
	}
	if w := peer(t, tr, "2001:db8::9", "web"); w.BytesReceived != 7 || w.Flows != 1 {
		t.Fatalf("v6 peer %+v", w)
	}
	// f1 gets no new sample, f2 one, and closes; f3 is evicted (absent).
	closed = tr.account(t0.Add(2*time.Second), []flowEntry{
		{f1, netobsFlow{SrttUs: 10000, MinRttUs: 9000, RttSamples: 3, BytesAcked: 3000, Retrans: 1, ClassId: 1}},
		{f2, netobsFlow{SrttUs: 50000, MinRttUs: 8000, RttSamples: 2, BytesAcked: 500, Retrans: 2, ClassId: 1, Closed: 1}},
	})
	if len(closed) != 1 || closed[0] != f2 {
		t.Fatalf("closed %v, want f2", closed)
	}
	p = peer(t, tr, "10.0.0.2", "kv")
	if p.Flows != 1 || p.SRTT != 50*time.Millisecond || p.MinRTT != 9*time.Millisecond || p.BytesAcked != 3500 || p.Retransmits != 3 {
		t.Fatalf("second poll: %+v", p)
	}
	if p.ThroughputBytesPerSec != 1000 { // 2000 bytes in 2 s
		t.Fatalf("throughput %v", p.ThroughputBytesPerSec)
	}
	if tr.counts.flowsClosed != 1 || tr.counts.flowsEvicted != 1 || len(tr.flows) != 1 {
		t.Fatalf("counts %+v, %d flows", tr.counts, len(tr.flows))
	}
	// A counter that goes back is a new connection on the old key.
	tr.account(t0.Add(3*time.Second), []flowEntry{
		{f1, netobsFlow{SrttUs: 10000, RttSamples: 1, BytesAcked: 100, ClassId: 1}},
	})
	if p = peer(t, tr, "10.0.0.2", "kv"); p.BytesAcked != 3600 {
		t.Fatalf("after reuse: %+v", p)
	}
	// Idle peers age out after PeerTTL; peers with open flows do not.
	tr.account(t0.Add(20*time.Second), []flowEntry{{f1, netobsFlow{SrttUs: 10000, RttSamples: 1, BytesAcked: 100, ClassId: 1}}})
	if ps := tr.Peers(); len(ps) != 1 || ps[0].Class != "kv" {
		t.Fatalf("after TTL: %+v", ps)
	}
}

func TestMaxPeers(t *testing.T) {
	tr := newTestTracker(t, Config{MaxPeers: 2})
	var entries []flowEntry
	for _, a := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		entries = append(entries, flowEntry{key(a, 1, 7000), netobsFlow{SrttUs: 1, RttSamples: 1, ClassId: 1}})
	}
	tr.account(time.Now(), entries)
	tr.account(time.Now(), entries) // a known dropped flow is not counted again
	if n := len(tr.Peers()); n != 2 || tr.counts.peersDropped != 1 {
		t.Fatalf("%d peers, %d dropped; want 2, 1", n, tr.counts.peersDropped)
	}
	// Another class of a tracked peer is no new peer.
	tr.ObserveTransfer("10.0.0.1:7600", 10, time.Millisecond, false)
	if n := len(tr.Peers()); n != 3 {
		t.Fatalf("%d aggregates", n)
	}
}

func TestObserveTransfer(t *testing.T) {
	tr := newTestTracker(t, Config{})
	tr.ObserveTransfer("192.0.2.7:7600", 1<<20, 10*time.Millisecond, false)
	tr.ObserveTransfer("192.0.2.7:7600", 1<<20, 30*time.Millisecond, false)
	tr.ObserveTransfer("192.0.2.7:7600", 0, time.Second, true)
	tr.ObserveTransfer("[::ffff:192.0.2.7]:7600", 0, time.Second, true)
	p := peer(t, tr, "192.0.2.7", NIXLClass)
	if p.Transfers != 2 || p.TransferFailures != 2 || p.BytesAcked != 2<<20 {
		t.Fatalf("%+v", p)
	}
	if want := 15 * time.Millisecond; p.TransferLatency != want { // 0.25*30 + 0.75*10
		t.Fatalf("latency %v, want %v", p.TransferLatency, want)
	}
	if want := 0.25*float64(1<<20)/0.03 + 0.75*float64(1<<20)/0.01; p.ThroughputBytesPerSec != want {
		t.Fatalf("throughput %v, want %v", p.ThroughputBytesPerSec, want)
	}
	if got := tr.counts.peersDropped; got != 0 {
		t.Fatalf("dropped %d", got)
	}
	// A name that does not resolve is counted, not tracked.
	tr.ObserveTransfer("no-such-host.invalid:7600", 1, time.Millisecond, false)
	if got := tr.counts.peersDropped; got != 1 {
		t.Fatalf("dropped %d after an unresolvable peer", got)
	}
}

// TestMetricsLint: the exported families pass Prometheus's linter and
// carry only the bounded labels.
func TestMetricsLint(t *testing.T) {
	tr := newTestTracker(t, Config{})
	tr.account(time.Now(), []flowEntry{{key("10.0.0.2", 1, 7000), netobsFlow{SrttUs: 100, RttSamples: 1, BytesAcked: 5, ClassId: 1}}})
	tr.ObserveTransfer("10.0.0.2:7600", 10, time.Millisecond, false)
	problems, err := promtestutil.CollectAndLint(tr)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	if n := promtestutil.CollectAndCount(tr, "kvgate_netobs_tcp_srtt_seconds", "kvgate_netobs_kv_transfer_seconds"); n != 2 {
		t.Errorf("%d histogram series, want one RTT and one transfer", n)
	}
}

// FuzzParseClass: --netobs-class values are operator input; whatever
// ParseClass accepts must be a class portTable can use.
func FuzzParseClass(f *testing.F) {
	for _, s := range []string{"kv=7600", "vllm=8000-8010,9000", "a=1-65535", "=1", "x=0", "x=2-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseClass(s)
		if err != nil {
			return
		}
		if c.Name == "" || !validName(c.Name) || len(c.Ranges) == 0 {
			t.Fatalf("%q parsed to %+v", s, c)
		}
		for _, r := range c.Ranges {
			if r.Lo == 0 || r.Hi < r.Lo {
				t.Fatalf("%q parsed to range %+v", s, r)
			}
		}
		if _, err := portTable([]Class{c}); err != nil {
			t.Fatalf("%q parsed to %+v, which portTable refuses: %v", s, c, err)
		}
	})
}

// fakeDNS answers from a table the test changes; a name missing from it
// fails to resolve.
type fakeDNS struct {
	mu      sync.Mutex
	answers map[string]netip.Addr
	lookups int
}

func (f *fakeDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	ip, ok := f.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return []netip.Addr{ip}, nil
}

func (f *fakeDNS) set(host, ip string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ip == "" {
		delete(f.answers, host)
	} else {
		f.answers[host] = netip.MustParseAddr(ip)
	}
}

// TestResolveTTL: a peer agent's name was looked up once and its answer
// kept for good, so a peer that moved to another address (a rescheduled
// pod) was reported under the old one for the life of the agent, and once
// MaxPeers names had been seen no new name was ever tracked. Now an answer
// lasts DNSTTL, the last good one serves while a lookup fails, and the
// least recently used name makes room.
func TestResolveTTL(t *testing.T) {
	dns := &fakeDNS{answers: map[string]netip.Addr{}}
	tr := newTestTracker(t, Config{DNSTTL: time.Minute, MaxPeers: 2, Resolver: dns})
	clock := time.Unix(1000, 0)
	tr.now = func() time.Time { return clock }
	resolve := func(name string) string {
		t.Helper()
		ip, ok := tr.resolve(name + ":7600")
		if !ok {
			return "unresolved"
		}
		return ip.String()
	}
	dns.set("peer-a", "192.0.2.1")
	if got := resolve("peer-a"); got != "192.0.2.1" {
		t.Fatalf("first lookup: %s", got)
	}
	dns.set("peer-a", "192.0.2.2") // the pod moved
	clock = clock.Add(30 * time.Second)
	if got := resolve("peer-a"); got != "192.0.2.1" || dns.lookups != 1 {
		t.Fatalf("within the TTL: %s after %d lookups, want the cached 192.0.2.1 after 1", got, dns.lookups)
	}
	clock = clock.Add(31 * time.Second)
	if got := resolve("peer-a"); got != "192.0.2.2" {
		t.Fatalf("past the TTL: %s, want the new address", got)
	}
	// DNS down: the last good answer serves, and is retried after dnsRetry,
	// not on every transfer.
	dns.set("peer-a", "")
	clock = clock.Add(61 * time.Second)
	if got := resolve("peer-a"); got != "192.0.2.2" {
		t.Fatalf("failed lookup: %s, want the last good address", got)
	}
	n := dns.lookups
	if got := resolve("peer-a"); got != "192.0.2.2" || dns.lookups != n {
		t.Fatalf("right after a failed lookup: %s after %d more lookups", got, dns.lookups-n)
	}
	dns.set("peer-a", "192.0.2.3")
	clock = clock.Add(dnsRetry)
	if got := resolve("peer-a"); got != "192.0.2.3" {
		t.Fatalf("retry after a failure: %s", got)
	}
	// Bounded: a third name evicts the least recently used one.
	dns.set("peer-b", "192.0.2.10")
	dns.set("peer-c", "192.0.2.20")
	resolve("peer-b")
	clock = clock.Add(time.Second)
	resolve("peer-a")
	if got := resolve("peer-c"); got != "192.0.2.20" {
		t.Fatalf("a name past MaxPeers: %s", got)
	}
	tr.resolveMu.Lock()
	_, hasA := tr.resolved["peer-a"]
	_, hasB := tr.resolved["peer-b"]
	size := len(tr.resolved)
	tr.resolveMu.Unlock()
	if size != 2 || !hasA || hasB {
		t.Fatalf("cache holds %d names (peer-a %v, peer-b %v); want 2 with peer-b evicted", size, hasA, hasB)
	}
}
