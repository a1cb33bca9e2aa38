package topology

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/disagg"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func ep(name string, labels map[string]string) *endpoints.Endpoint {
	return endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: name + ":8000", Labels: labels})
}

func loc(host, rack, zone, region string) map[string]string {
	l := map[string]string{}
	for k, v := range map[string]string{"kubernetes.io/hostname": host, "topology.kubernetes.io/rack": rack,
		"topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": region} {
		if v != "" {
			l[k] = v
		}
	}
	return l
}

// candidates of a prefill profile: same host as the decode pick, same
// rack, same zone, same region, elsewhere, and without labels.
func candidates() []*endpoints.Endpoint {
	return []*endpoints.Endpoint{
		ep("host", loc("h1", "r1", "z1", "eu")),
		ep("rack", loc("h2", "r1", "z1", "eu")),
		ep("zone", loc("h3", "r2", "z1", "eu")),
		ep("region", loc("h4", "r3", "z2", "eu")),
		ep("far", loc("h5", "r4", "z3", "us")),
		ep("bare", nil),
	}
}

func build(t *testing.T, typ, params string) scheduling.Plugin {
	t.Helper()
	x, _ := NewExtractor(ExtractorType, nil, nil)
	f := map[string]scheduling.Factory{FilterType: NewFilter, ScorerType: NewScorer}[typ]
	p, err := f("", []byte(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.(scheduling.Resolver).Resolve(func(n string) (scheduling.Plugin, bool) { return x, n == ExtractorType }); err != nil {
		t.Fatal(err)
	}
	return p
}

func withPeer(peer *endpoints.Endpoint) *scheduling.CycleState {
	cs := scheduling.NewCycleState()
	if peer != nil {
		scheduling.Write(cs, disagg.PeerKey, peer)
	}
	return cs
}

func TestFilter(t *testing.T) {
	decode := ep("decode", loc("h1", "r1", "z1", "eu"))
	for _, tc := range []struct {
		params string
		peer   *endpoints.Endpoint
		cands  []*endpoints.Endpoint
		want   string
	}{
		{params: `{}`, peer: decode, want: "host"},
		{params: `{"minAffinity":"rack"}`, peer: decode, want: "host,rack"},
		{params: `{"minAffinity":"zone"}`, peer: decode, want: "host,rack,zone"},
		{params: `{"minAffinity":"region"}`, peer: decode, want: "host,rack,zone,region"},
		{params: `{}`, peer: nil, want: "host,rack,zone,region,far,bare"},                           // no decode pick yet
		{params: `{}`, peer: ep("d", nil), want: "host,rack,zone,region,far,bare"},                  // its locality unknown
		{params: `{}`, peer: decode, cands: candidates()[3:], want: "region,far,bare"},              // none qualifies: all kept
		{params: `{}`, peer: ep("d", loc("", "r1", "", "")), cands: candidates()[5:], want: "bare"}, // empty never matches empty
	} {
		cands := tc.cands
		if cands == nil {
			cands = candidates()
		}
		f := build(t, FilterType, tc.params).(*Filter)
		if got := strings.Join(schedtest.Names(f.Filter(context.Background(), withPeer(tc.peer), &scheduling.Request{}, cands)), ","); got != tc.want {
			t.Errorf("%s peer %v: kept %s, want %s", tc.params, tc.peer, got, tc.want)
		}
	}
}

func TestScorer(t *testing.T) {
	s := build(t, ScorerType, `{}`).(*Scorer)
	cands := candidates()
	scores := make([]float64, len(cands))
	s.Score(context.Background(), withPeer(ep("decode", loc("h1", "r1", "z1", "eu"))), &scheduling.Request{}, cands, scores)
	want := []float64{1, 0.2, 0.05, 0.02, 0, 0}
	for i := range want {
		if scores[i] != want[i] {
			t.Fatalf("scores %v, want %v", scores, want)
		}
	}
	clear(scores)
	s.Score(context.Background(), withPeer(nil), &scheduling.Request{}, cands, scores)
	for _, v := range scores {
		if v != 0 {
			t.Fatalf("scored without a peer: %v", scores)
		}
	}
}

func TestParams(t *testing.T) {
	x, _ := NewExtractor("", []byte(`{"hostname":"node","rack":"my/rack"}`), nil)
	a := ep("a", map[string]string{"node": "n1"})
	b := ep("b", map[string]string{"node": "n2", "my/rack": "r"})
	c := ep("c", map[string]string{"node": "n3", "my/rack": "r"})
	if l := x.(*Extractor).Compare(a, a); l != Host {
		t.Errorf("custom hostname label: %v", l)
	}
	if l := x.(*Extractor).Compare(b, c); l != Rack {
		t.Errorf("custom rack label: %v", l)
	}
	if _, err := NewFilter("", []byte(`{"minAffinity":"node"}`), nil); err == nil || !strings.Contains(err.Error(), "host, rack, zone or region") {
		t.Errorf("minAffinity node: %v", err)
	}
	f, _ := NewScorer("", []byte(`{"topologyProducerName":"topo"}`), nil)
	if err := f.(*Scorer).Resolve(func(string) (scheduling.Plugin, bool) { return nil, false }); err == nil || !strings.Contains(err.Error(), `"topo" is not a configured plugin`) {
		t.Errorf("dangling producer: %v", err)
	}
	if err := f.(*Scorer).Resolve(func(string) (scheduling.Plugin, bool) { return scheduling.NewNamed("queue-scorer", "topo"), true }); err == nil {
		t.Error("a queue scorer accepted as the topology producer")
	}
}
