package topology

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/disagg"
	"github.com/kvgate/kvgate/extproc/plugins/endpointnotification"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	ExtractorType = "topology-extractor"
	FilterType    = "topology-affinity-filter"
	ScorerType    = "topology-affinity-scorer"
)

// Level is a topology tier, tightest first.
type Level int

// The levels.
const (
	Host Level = iota
	Rack
	Zone
	Region
	None
)

var levelNames = []string{"host", "rack", "zone", "region"}

// levelScores is llm-d's proximity curve.
var levelScores = [...]float64{Host: 1, Rack: 0.2, Zone: 0.05, Region: 0.02, None: 0}

// ExtractorParams are topology-extractor's parameters.
type ExtractorParams struct {
	Hostname string `json:"hostname"`
	Rack     string `json:"rack"`
	Zone     string `json:"zone"`
	Region   string `json:"region"`
}

// Extractor implements topology-extractor.
//
// Parameters (llm-d's): the pod label keys of each level.
//
//	hostname: string  default kubernetes.io/hostname
//	rack: string      default topology.kubernetes.io/rack
//	zone: string      default topology.kubernetes.io/zone
//	region: string    default topology.kubernetes.io/region
type Extractor struct {
	scheduling.Named
	keys [4]string // by Level
}

// NewExtractor is topology-extractor's factory.
func NewExtractor(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	p := ExtractorParams{}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	return &Extractor{Named: scheduling.NewNamed(ExtractorType, name), keys: [4]string{
		or(p.Hostname, "kubernetes.io/hostname"), or(p.Rack, "topology.kubernetes.io/rack"),
		or(p.Zone, "topology.kubernetes.io/zone"), or(p.Region, "topology.kubernetes.io/region")}}, nil
}

// AcceptsSource implements scheduling.DataExtractor: llm-d feeds the
// extractor endpoint notifications (it reads the endpoints' labels, which
// every endpoint carries, so it needs no wiring in dataLayer).
func (x *Extractor) AcceptsSource(src scheduling.DataSource) error {
	if _, ok := src.(*endpointnotification.Source); !ok {
		return fmt.Errorf("%s reads %s, not %s", ExtractorType, endpointnotification.Type, src.TypedName().Type)
	}
	return nil
}

// Compare is the tightest level a and b share (None when nothing).
func (x *Extractor) Compare(a, b *endpoints.Endpoint) Level {
	for l, key := range x.keys {
		if v := a.Label(key); v != "" && v == b.Label(key) {
			return Level(l)
		}
	}
	return None
}

// known reports whether e has any locality.
func (x *Extractor) known(e *endpoints.Endpoint) bool {
	for _, key := range x.keys {
		if e.Label(key) != "" {
			return true
		}
	}
	return false
}

// reader is what the filter and the scorer share: the extractor and the
// earlier stage's pick.
type reader struct {
	producerName string
	extractor    *Extractor
}

func (r *reader) resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	x, err := scheduling.LookupAs[*Extractor](lookup, "topologyProducerName", r.producerName, "a "+ExtractorType)
	if err != nil {
		return err
	}
	r.extractor = x
	return nil
}

// peer is the earlier stage's pick (disagg.PeerKey) when its locality is
// known.
func (r *reader) peer(cs *scheduling.CycleState) (*endpoints.Endpoint, bool) {
	p, ok := scheduling.Read(cs, disagg.PeerKey)
	if !ok || p == nil || !r.extractor.known(p) {
		return nil, false
	}
	return p, true
}

func producerName(v string) string {
	if v == "" {
		return ExtractorType
	}
	return v
}

// FilterParams are topology-affinity-filter's parameters.
type FilterParams struct {
	MinAffinity          string `json:"minAffinity"`
	TopologyProducerName string `json:"topologyProducerName"`
}

// Filter implements topology-affinity-filter.
//
// Parameters (llm-d's):
//
//	minAffinity: string           host (default), rack, zone or region
//	topologyProducerName: string  the extractor (default the one named
//	                              topology-extractor)
type Filter struct {
	scheduling.Named
	reader
	min Level
}

// NewFilter is topology-affinity-filter's factory.
func NewFilter(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p FilterParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	f := &Filter{Named: scheduling.NewNamed(FilterType, name), reader: reader{producerName: producerName(p.TopologyProducerName)}, min: None}
	if p.MinAffinity == "" {
		p.MinAffinity = "host"
	}
	for l, n := range levelNames {
		if n == p.MinAffinity {
			f.min = Level(l)
		}
	}
	if f.min == None {
		return nil, fmt.Errorf("parameters.minAffinity: want host, rack, zone or region, got %q", p.MinAffinity)
	}
	return f, nil
}

// Resolve implements scheduling.Resolver.
func (f *Filter) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	return f.resolve(lookup)
}

// Filter implements scheduling.Filter.
func (f *Filter) Filter(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	peer, ok := f.peer(cs)
	if !ok {
		return eps
	}
	kept := make([]*endpoints.Endpoint, 0, len(eps))
	for _, e := range eps {
		if f.extractor.Compare(peer, e) <= f.min {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		return eps
	}
	return kept
}

// ScorerParams are topology-affinity-scorer's parameters.
type ScorerParams struct {
	TopologyProducerName string `json:"topologyProducerName"`
}

// Scorer implements topology-affinity-scorer.
//
// Parameters (llm-d's):
//
//	topologyProducerName: string  the extractor (default the one named
//	                              topology-extractor)
type Scorer struct {
	scheduling.Named
	reader
}

// NewScorer is topology-affinity-scorer's factory.
func NewScorer(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p ScorerParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	return &Scorer{Named: scheduling.NewNamed(ScorerType, name), reader: reader{producerName: producerName(p.TopologyProducerName)}}, nil
}

// Resolve implements scheduling.Resolver.
func (s *Scorer) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	return s.resolve(lookup)
}

// Score implements scheduling.Scorer.
func (s *Scorer) Score(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	peer, ok := s.peer(cs)
	if !ok {
		return
	}
	for i, e := range eps {
		scores[i] = levelScores[s.extractor.Compare(peer, e)]
	}
}

var (
	_ scheduling.DataExtractor = (*Extractor)(nil)
	_ scheduling.Filter        = (*Filter)(nil)
	_ scheduling.Scorer        = (*Scorer)(nil)
	_ scheduling.Resolver      = (*Filter)(nil)
	_ scheduling.Resolver      = (*Scorer)(nil)
)
