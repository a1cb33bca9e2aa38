package telemetry

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

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
