// Package transfercost is kvgate's transfer-cost-pd-decider: a prefill
// decider for disagg-profile-handler that disaggregates a request when its
// predicted time to first token with a remote prefill — the prefill
// server's predicted TTFT, plus moving the KV of the tokens the decode
// server lacks over the network between the two, plus the extra leg's
// overhead, plus one decode step — beats its predicted TTFT prefilled on
// the decode server itself. llm-d's prefix-based-pd-decider compares the
// uncached tokens with a fixed threshold; that cannot see a busy decode
// server (whose decode batch slows every prefill step), an idle or loaded
// prefill pool, or a slow network, all of which decide whether P/D pays.
//
// The same rule chooses P2P pulls: p2p-source-producer, given this plugin
// as its pullDecider, names a KV source only when moving the extra cached
// tokens from it is faster than computing them.
//
// # Inputs
//
// The predictions are those of predicted-latency-producer (extproc/latency:
// per server, from the uncached tokens and the live load). Without that
// producer the TTFT is the server's live prefill backlog plus the request's
// uncached tokens at prefillTokensPerSecond. The held tokens come from the
// published prefix match. The possible prefill servers are those the filter
// named prefillFilter keeps.
//
// The network comes from a NetworkView (the node agents' measured paths),
// set with SetNetworkView or registered as the handle service
// ServiceNetworkView; where it has no path (or none is set) the static
// bandwidth and rtt parameters stand in.
//
// As a scorer in the prefill profile it rates each prefill server by the
// same predicted remote TTFT, so that the server the decision assumed is
// the one picked.
//
// Parameters:
//
//	kvBytesPerToken: int     KV-cache bytes one token occupies, all layers
//	                         (default 131072: Llama-3-8B in bf16, 32 layers
//	                         × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes)
//	bandwidthBytesPerSecond: float  path bandwidth without a measurement
//	                         (default 12e9, 100 Gb/s RoCE at NIXL's rate)
//	rtt: duration            path round trip without a measurement
//	                         (default 100us)
//	overhead: duration       fixed cost of the remote prefill leg: the
//	                         sidecar's extra request and the transfer's
//	                         handshake (default 2ms)
//	prefillTokensPerSecond: float  prefill rate without the predictor
//	                         (default 15928, llm-d's peakPrefillThroughput)
//	prefillFilter: string    the filter plugin that keeps prefill servers
//	                         (default "prefill-filter")
//	decodeStallWeight: float  weight of what a local prefill costs the
//	                         requests decoding on the decode server: each
//	                         of them waits out the prefill's compute time
//	                         (default 0: the request's own TTFT alone; 1
//	                         counts their stall like the request's TTFT,
//	                         minimising the sum of all requests' latency)
package transfercost

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "transfer-cost-pd-decider"

// NetworkView is the measured network between model servers, addressed by
// their endpoint addresses ("host:port"): the bandwidth and round trip of
// the path from one to the other; ok is false when it knows no such path.
type NetworkView interface {
	PathBetween(fromEndpoint, toEndpoint string) (bytesPerSecond float64, rtt time.Duration, ok bool)
}

// ServiceNetworkView is the handle service key under which a binary may
// register a NetworkView for every instance.
const ServiceNetworkView = "network-view"

// Defaults.
const (
	DefaultKVBytesPerToken        = 131072
	DefaultBandwidth              = 12e9
	DefaultRTT                    = 100 * time.Microsecond
	DefaultOverhead               = 2 * time.Millisecond
	DefaultPrefillTokensPerSecond = 15928
	DefaultPrefillFilter          = "prefill-filter"
)

// Params are the plugin's parameters.
type Params struct {
	KVBytesPerToken         int64               `json:"kvBytesPerToken"`
	BandwidthBytesPerSecond float64             `json:"bandwidthBytesPerSecond"`
	RTT                     scheduling.Duration `json:"rtt"`
	Overhead                scheduling.Duration `json:"overhead"`
	PrefillTokensPerSecond  float64             `json:"prefillTokensPerSecond"`
	PrefillFilter           string              `json:"prefillFilter"`
	DecodeStallWeight       float64             `json:"decodeStallWeight"`
}

// Decider implements transfer-cost-pd-decider.
type Decider struct {
	scheduling.Named
	p      Params
	view   atomic.Pointer[NetworkView]
	filter scheduling.Filter
	key    scheduling.Key[*state]
}

// state is one request's snapshot of every candidate, taken when the data
// producers run: the latency predictions and the prefix match are recycled
// before PreRequest, where a P2P pull is decided.
type state struct {
	prompt     int
	candidates []*endpoints.Endpoint
	// ttft and step are each candidate's predicted TTFT and decode step
	// (seconds; step 0 when unknown), rate its effective prefill rate now
	// (tokens per second), held its cached prompt tokens.
	ttft, step, rate []float64
	held             []int
	// decodes are the sequences decoding there.
	decodes []float64
	// remote is each candidate's predicted TTFT as the prefill server of
	// the last decision (+Inf for those that cannot be), for Score.
	remote []float64
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{
		KVBytesPerToken: DefaultKVBytesPerToken, BandwidthBytesPerSecond: DefaultBandwidth,
		RTT: scheduling.Duration(DefaultRTT), Overhead: scheduling.Duration(DefaultOverhead),
		PrefillTokensPerSecond: DefaultPrefillTokensPerSecond, PrefillFilter: DefaultPrefillFilter,
	}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	switch {
	case p.KVBytesPerToken <= 0:
		return nil, fmt.Errorf("parameters.kvBytesPerToken must be positive, got %d", p.KVBytesPerToken)
	case !(p.BandwidthBytesPerSecond > 0) || math.IsInf(p.BandwidthBytesPerSecond, 0):
		return nil, fmt.Errorf("parameters.bandwidthBytesPerSecond must be positive, got %v", p.BandwidthBytesPerSecond)
	case !(p.PrefillTokensPerSecond > 0) || math.IsInf(p.PrefillTokensPerSecond, 0):
		return nil, fmt.Errorf("parameters.prefillTokensPerSecond must be positive, got %v", p.PrefillTokensPerSecond)
	case p.RTT < 0 || p.Overhead < 0:
		return nil, fmt.Errorf("parameters.rtt and overhead must not be negative")
	case p.PrefillFilter == "":
		return nil, fmt.Errorf("parameters.prefillFilter must name a filter")
	case !(p.DecodeStallWeight >= 0) || math.IsInf(p.DecodeStallWeight, 0):
		return nil, fmt.Errorf("parameters.decodeStallWeight must be a non-negative number, got %v", p.DecodeStallWeight)
	}
	d := &Decider{Named: scheduling.NewNamed(Type, name), p: p}
	d.key = scheduling.NewKey[*state](d.TypedName().String())
	if v, ok := scheduling.Service[NetworkView](h, ServiceNetworkView); ok && v != nil {
		d.SetNetworkView(v)
	}
	return d, nil
}

// SetNetworkView makes v the decider's network; nil returns it to the
// static parameters. Safe while requests are decided.
func (d *Decider) SetNetworkView(v NetworkView) {
	if v == nil {
		d.view.Store(nil)
		return
	}
	d.view.Store(&v)
}

// Resolve implements scheduling.Resolver.
func (d *Decider) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	p, ok := lookup(d.p.PrefillFilter)
	if !ok {
		return fmt.Errorf("parameters.prefillFilter: %q is not a configured plugin", d.p.PrefillFilter)
	}
	f, ok := p.(scheduling.Filter)
	if !ok {
		return fmt.Errorf("parameters.prefillFilter: %q (type %s) is not a filter", d.p.PrefillFilter, p.TypedName().Type)
	}
	d.filter = f
	return nil
}

// Produces implements scheduling.DataDependencies.
func (d *Decider) Produces() []string { return nil }

// Consumes implements scheduling.DataDependencies.
func (d *Decider) Consumes() []string {
	return []string{prefixmatch.MatchKey.String(), latency.PredictionsKey.String()}
}

// Produce implements scheduling.DataProducer: the snapshot of every
// candidate.
func (d *Decider) Produce(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	n := len(eps)
	st := &state{candidates: eps, ttft: make([]float64, n), step: make([]float64, n), rate: make([]float64, n),
		held: make([]int, n), remote: make([]float64, n), decodes: make([]float64, n)}
	st.prompt = req.PromptTokens
	m, _ := scheduling.Read(cs, prefixmatch.MatchKey)
	if m != nil {
		st.prompt = m.Prompt(st.prompt)
	}
	preds, _ := scheduling.Read(cs, latency.PredictionsKey)
	for i, e := range eps {
		if m != nil {
			st.held[i] = m.HeldTokensOf(e)
		}
		uncached := prefixmatch.Uncached(st.prompt, st.held[i])
		k := predicted(preds, e, i)
		if k < 0 {
			// The live backlog at the configured rate.
			l := e.Load()
			st.decodes[i] = float64(l.DecodeRequests + l.ExternalRunning)
			st.rate[i] = d.p.PrefillTokensPerSecond
			st.ttft[i] = float64(e.Load().PrefillTokens+int64(uncached)) / st.rate[i]
			continue
		}
		est, f := preds.Estimates[k], preds.Features[k]
		st.ttft[i], st.step[i], st.decodes[i] = est.TTFT.Seconds(), est.TPOT.Seconds(), f.Decodes
		st.rate[i] = d.p.PrefillTokensPerSecond
		if work := f.Prefill + f.Backlog; work > 0 && st.ttft[i] > 0 {
			st.rate[i] = work / st.ttft[i]
		}
	}
	scheduling.Write(cs, d.key, st)
}

// predicted is e's index in preds (usually i: every producer of a request
// sees the same candidates), -1 when it has no prediction.
func predicted(preds *latency.Predictions, e *endpoints.Endpoint, i int) int {
	if preds == nil {
		return -1
	}
	if i < len(preds.Candidates) && preds.Candidates[i] == e {
		return i
	}
	for k, c := range preds.Candidates {
		if c == e {
			return k
		}
	}
	return -1
}

func (st *state) index(e *endpoints.Endpoint) int {
	for i, c := range st.candidates {
		if c == e {
			return i
		}
	}
	return -1
}

// path is the transfer time of bytes from one server to another.
func (d *Decider) transfer(from, to *endpoints.Endpoint, bytes float64) float64 {
	bw, rtt := d.p.BandwidthBytesPerSecond, time.Duration(d.p.RTT)
	if v := d.view.Load(); v != nil {
		if b, r, ok := (*v).PathBetween(from.Address(), to.Address()); ok && b > 0 {
			bw, rtt = b, r
		}
	}
	return bytes/bw + rtt.Seconds()
}

// Costs is one decision's comparison, for tests and benchmarks.
type Costs struct {
	// Local is the predicted TTFT prefilled on the decode server (plus
	// the weighted stall of its decodes), Remote the best with a remote
	// prefill (+Inf without a prefill server) on Prefill.
	Local, Remote time.Duration
	Prefill       *endpoints.Endpoint
}

// Compare predicts the request's TTFT on decode, locally and with each
// prefill server the prefill filter keeps; ok is false before Produce.
func (d *Decider) Compare(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, decode *endpoints.Endpoint) (c Costs, ok bool) {
	st, ok := scheduling.Read(cs, d.key)
	if !ok || decode == nil {
		return Costs{}, false
	}
	j := st.index(decode)
	if j < 0 {
		return Costs{}, false
	}
	uncached := float64(prefixmatch.Uncached(st.prompt, st.held[j]))
	// A local prefill also holds up every sequence decoding there for its
	// compute time.
	local := st.ttft[j] + d.p.DecodeStallWeight*st.decodes[j]*uncached/st.rate[j]
	// The decode server receives the KV of every prompt token it lacks.
	bytes := float64(d.p.KVBytesPerToken) * uncached
	kept := d.filter.Filter(ctx, cs, req, append([]*endpoints.Endpoint(nil), st.candidates...))
	best := math.Inf(1)
	for i := range st.remote {
		st.remote[i] = math.Inf(1)
	}
	c.Local = seconds(local)
	for _, p := range kept {
		i := st.index(p)
		if p == decode || i < 0 {
			continue
		}
		r := st.ttft[i] + d.transfer(p, decode, bytes) + time.Duration(d.p.Overhead).Seconds() + st.step[j]
		st.remote[i] = r
		if r < best {
			best, c.Prefill = r, p
		}
	}
	c.Remote = seconds(best)
	return c, true
}

func seconds(s float64) time.Duration {
	if math.IsInf(s, 1) || s > float64(math.MaxInt64)/1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}

// Disaggregate implements disagg.Decider.
func (d *Decider) Disaggregate(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, decode *endpoints.Endpoint) bool {
	c, ok := d.Compare(ctx, cs, req, decode)
	return ok && c.Prefill != nil && c.Remote < c.Local
}

// Score implements scheduling.Scorer: in the prefill profile, the fastest
// predicted remote prefill scores 1, the slowest 0.
func (d *Decider) Score(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	st, ok := scheduling.Read(cs, d.key)
	if !ok {
		return
	}
	cost := func(e *endpoints.Endpoint) float64 {
		if i := st.index(e); i >= 0 && !math.IsInf(st.remote[i], 1) {
			return st.remote[i]
		}
		return math.MaxFloat64
	}
	scheduling.InverseMinMax(eps, scores, cost)
	for i, e := range eps {
		if cost(e) == math.MaxFloat64 {
			scores[i] = 0
		}
	}
}

// PullPays reports whether computing, lacking tokens prompt tokens that
// source holds, gets them faster over the network than by computing them
// (p2p-source-producer's pullDecider). Before Produce it says no.
func (d *Decider) PullPays(cs *scheduling.CycleState, source, computing *endpoints.Endpoint, tokens int) bool {
	st, ok := scheduling.Read(cs, d.key)
	if !ok || tokens <= 0 {
		return false
	}
	c := st.index(computing)
	if c < 0 {
		return false
	}
	pull := d.transfer(source, computing, float64(d.p.KVBytesPerToken)*float64(tokens))
	return pull < float64(tokens)/st.rate[c]
}

var (
	_ scheduling.DataProducer     = (*Decider)(nil)
	_ scheduling.DataDependencies = (*Decider)(nil)
	_ scheduling.Resolver         = (*Decider)(nil)
	_ scheduling.Scorer           = (*Decider)(nil)
)
