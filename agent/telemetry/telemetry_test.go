package telemetry

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

func TestTransferTracker(t *testing.T) {
	now := time.Unix(1000, 0)
	tr := NewTransferTracker(2, func() time.Time { return now })
	tr.Observe("10.0.0.2:7600", 8<<20, 8*time.Millisecond) // 1 GiB/s... per MiB: 1e9-ish
	tr.Observe("10.0.0.2:7600", 8<<20, 16*time.Millisecond)
	tr.Observe("10.0.0.2:7601", 0, 4*time.Millisecond)
	tr.Observe("vllm-0:7600", 1, time.Millisecond) // not an IP: dropped
	tr.Observe("10.0.0.9:1", 1, 0)                 // no duration: dropped
	ps := tr.Peers()
	if len(ps) != 1 {
		t.Fatalf("peers %+v", ps)
	}
	p := ps[0]
	// SRTT: 8 ms, then +(16-8)/8 = 9 ms, then +(4-9)/8.
	if want := 9*time.Millisecond + (4*time.Millisecond-9*time.Millisecond)/8; p.SRTT != want || p.MinRTT != 4*time.Millisecond {
		t.Errorf("srtt %v min %v, want %v and 4ms", p.SRTT, p.MinRTT, want)
	}
	r1 := float64(8<<20) / 0.008
	r2 := r1 + (float64(8<<20)/0.016-r1)/4
	if want := r2 + (0-r2)/4; p.ThroughputBytesPerSec != want {
		t.Errorf("throughput %v, want %v", p.ThroughputBytesPerSec, want)
	}
	if p.Flows != 2 || p.BytesAcked != 16<<20 || p.Class != ClassNIXL || !p.Updated.Equal(now) {
		t.Errorf("peer %+v", p)
	}
	// Bounded: a third peer evicts the least recently updated.
	now = now.Add(time.Second)
	tr.Observe("10.0.0.3:7600", 1, time.Millisecond)
	now = now.Add(time.Second)
	tr.Observe("[::ffff:10.0.0.4]:7600", 1, time.Millisecond)
	ps = tr.Peers()
	if len(ps) != 2 || ps[0].Peer != netip.MustParseAddr("10.0.0.3") || ps[1].Peer != netip.MustParseAddr("10.0.0.4") {
		t.Errorf("after eviction %+v", ps)
	}
}

type manyPeers int

func (n manyPeers) Peers() []PeerStats {
	out := make([]PeerStats, n)
	for i := range out {
		out[i] = PeerStats{Peer: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Class: "kv-tcp", Updated: time.Unix(int64(i), 0)}
	}
	return out
}

func TestReportKeepsTheFreshestPeers(t *testing.T) {
	s, err := NewServer(Config{Node: "n", Peers: []PeerSource{manyPeers(MaxReportPeers + 10)}})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Report()
	if len(r.Peers) != MaxReportPeers || r.GpuAvailable || r.GpuUnavailableReason == "" {
		t.Fatalf("%d peers, gpu %v %q", len(r.Peers), r.GpuAvailable, r.GpuUnavailableReason)
	}
	for _, p := range r.Peers {
		if p.UpdatedUnixNano < int64(10)*1e9 {
			t.Fatalf("an old peer kept: %v", p)
		}
	}
	if _, err := NewServer(Config{}); err == nil {
		t.Error("a server without a node name")
	}
}

func TestReportGPUs(t *testing.T) {
	at := time.Unix(50, 0)
	s, err := NewServer(Config{Node: "n", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, GPUs: fixed{
		{Index: 2, UUID: "GPU-x", XIDErrors: 1, LastXID: 79, LastXIDTime: at, ThrottleReasons: 0x40, Endpoints: []string{"10.0.0.1:8000"}}}})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Report()
	if !r.GpuAvailable || len(r.Gpus) != 1 || r.Addresses[0] != "10.0.0.1" {
		t.Fatalf("report %v", r)
	}
	g := r.Gpus[0]
	if g.Index != 2 || g.Uuid != "GPU-x" || g.LastXid != 79 || g.LastXidUnixNano != at.UnixNano() || g.ThrottleReasons != 0x40 || fmt.Sprint(g.Endpoints) != "[10.0.0.1:8000]" {
		t.Errorf("gpu %v", g)
	}
}

type fixed []GPU

func (f fixed) GPUs() []GPU               { return f }
func (f fixed) Available() (bool, string) { return true, "" }
