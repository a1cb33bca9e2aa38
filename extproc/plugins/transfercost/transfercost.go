// Package transfercost is kvgate's transfer-cost-pd-decider: a prefill
// decider for disagg-profile-handler that disaggregates a request when its
// cost with a remote prefill beats its cost prefilled on the decode server
// itself. llm-d's prefix-based-pd-decider compares the uncached tokens with
// a fixed threshold; that cannot see a busy decode server, an idle or
// loaded prefill pool, or a slow network, all of which decide whether P/D
// pays.
//
// # The costs
//
// Both sides are priced by one explicit model of a server, from the live
// load (the prefill backlog routed there and not yet at its first token,
// the sequences decoding there) and the measured network:
//
//   - compute(server) = (backlog + uncached tokens) / prefillTokensPerSecond,
//     plus their attention pairs / prefillAttentionPairsPerSecond; the
//     prefill runs in ceil(tokens / maxNumBatchedTokens) steps, none
//     shorter than the server's decode step.
//   - local = what is left of the step in progress there (the predictor's
//     figure, else half a decode step while it is decoding) + that compute
//     on the decode server, plus
//     interferenceWeight × the stall the request's prefill causes while
//     sequences decode there: what its chunks add to the decode steps that
//     run anyway (its compute less one decode step per chunk; none for a
//     prompt that fits in a step's idle compute), which every one of them
//     waits for its next token, the inter-token-latency spike; plus
//     decodeStallWeight × their number × that stall (the sum of it).
//   - remote = that compute on the prefill server + overhead (the sidecar's
//     extra leg and the transfer's set-up) + the path's round trip + the KV
//     of every prompt token the decode server lacks over the path's
//     bandwidth + two steps on the decode server (it starts the pull
//     at a step boundary, on average half a step after the request
//     arrives, sees it landed at another and samples in the step after):
//     decode steps, or, when the KV lands before the decode server's own
//     queued prefills are done, steps carrying their chunks.
//
// The live load charges a remote prefill to its prefill server until the
// decode server's first token, that is also while its KV is on the wire
// (a long time on a slow path), when the server is free of it. The
// decider predicts each candidate's finish (scheduling.PrefillFinish);
// the director puts the prefill server's on the request's remote charge,
// and the decider reads the backlog less the charges past their finish
// (endpoints.Endpoint.PrefillBacklog): one account, released at once.
//
// A prefill of compute c also delays the requests that reach its server
// while it runs: arriving at rate λ, they wait λ·c²/2 seconds in all.
// queueWeight × that is added to each side, λ measured by the decider
// itself: the rate of the requests it decides over the last
// rateSamples of them, per decode server for a local prefill, and the
// rate of those it disaggregates, per prefill server, for a remote one.
//
// With the default weights the rule keeps a request's TTFT where P/D would
// raise it by more than twice the ITL spike it spares the decode batch:
// long prompts over a fast path disaggregate, short prompts (whose spike
// is a few milliseconds) and transfers over slow paths do not, and a
// queued prefill pool sends prefills back to the decode servers.
//
// interferenceWeight is the exchange rate between a second of the
// request's own TTFT and a second of the spike. 1 counts the spike once,
// as if one sequence felt it; decodeStallWeight 1 counts it for each of
// the n sequences decoding there (the sum of their latency). Any weight
// between the two is a choice of how many of them the operator's
// latency objective counts, not a derived constant. The default 2 is an
// empirical one, measured on issue 16's benchmark (benchmarks/RESULTS.md):
// at 1 the decider keeps a quarter of the long prompts home on a fast
// network, and their stalls, on decode batches twice a collocated
// server's, leave the fleet at the collocated TPOT; at 2 it takes most of
// P/D's ITL gain there, still keeps long prompts over slow paths and short
// prompts local, and loses fewer cells to prefix-based-pd-decider's
// thresholds on the mixed sweep; at 3 it starts to send long prompts over
// slow paths.
//
// Two other settings price a decision by what it costs everyone, without
// a tuned constant: {interferenceWeight: 0, queueWeight: 1} is the TTFT of the
// request and of those that queue behind its prefill;
// {interferenceWeight: 0, decodeStallWeight: 1, queueWeight: 1} adds the
// stall of every decoding sequence, the sum of all requests' latency. The
// first wins TTFT at the price of ITL, the second the reverse (measured
// in benchmarks/RESULTS.md, issue 16's sweep).
//
// The decode step is predicted-latency-producer's TPOT prediction for the
// server (extproc/latency) where that producer runs, decodeStep otherwise.
// Its TTFT predictions are not used: they are learned from the responses
// the picker sees, that is from local prefills on decode servers only
// (a prefill leg's response never reaches the picker), and extrapolate
// badly to a prefill server's state or a load they were not fitted on
// (measured in the benchmark: 0.95 s predicted for a 256-token prefill on
// an idle prefill server that takes 8 ms). The prefill rates are the
// hardware's, as llm-d's peakPrefillThroughput is configured.
//
// The same model chooses P2P pulls: p2p-source-producer, given this plugin
// as its pullDecider, names a KV source only when moving the extra cached
// tokens from it is faster than computing them.
//
// # Inputs
//
// The held tokens come from the published prefix match. The possible
// prefill servers are those the filter named prefillFilter keeps.
//
// The network comes from a NetworkView (the node agents' measured paths),
// set with SetNetworkView or registered as the handle service
// ServiceNetworkView; where it has no path (or none is set) the static
// bandwidth and rtt parameters stand in. The measured bandwidth is that of
// bulk transfers; a small transfer is dominated by rtt and overhead, which
// are added whole to every transfer.
//
// As a scorer it rates, in the decode profile, each decode server by the
// cost of the request's best choice there (local or remote prefill), and in
// the prefill profile each prefill server by its predicted remote TTFT, so
// that the servers the decision assumed are the ones picked.
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
//	prefillTokensPerSecond: float  a server's prefill rate, linear part
//	                         (default 15928, llm-d's peakPrefillThroughput)
//	prefillAttentionPairsPerSecond: float  its rate in causal attention
//	                         pairs (default 0: attention not priced)
//	maxNumBatchedTokens: int  the servers' per-step token budget (default
//	                         8192, vLLM's)
//	decodeStep: duration     a decode step without the latency predictor
//	                         (default 10ms)
//	prefillFilter: string    the filter plugin that keeps prefill servers
//	                         (default "prefill-filter")
//	interferenceWeight: float  weight of the ITL spike a local prefill
//	                         causes the sequences decoding there (default 2;
//	                         0: the request's TTFT alone)
//	decodeStallWeight: float  weight of the sum of those sequences' stall
//	                         (default 0; 1, with interferenceWeight 0 and
//	                         queueWeight 1, minimises the sum of all
//	                         requests' latency)
//	queueWeight: float       weight of the wait the prefill imposes on the
//	                         prefills arriving behind it on the same server
//	                         (default 0; 1: their expected sum)
package transfercost

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
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
	DefaultMaxNumBatchedTokens    = 8192
	DefaultDecodeStep             = 10 * time.Millisecond
	DefaultPrefillFilter          = "prefill-filter"
	DefaultInterferenceWeight     = 2
)

// Params are the plugin's parameters.
type Params struct {
	KVBytesPerToken                int64             `json:"kvBytesPerToken"`
	BandwidthBytesPerSecond        float64           `json:"bandwidthBytesPerSecond"`
	RTT                            duration.Duration `json:"rtt"`
	Overhead                       duration.Duration `json:"overhead"`
	PrefillTokensPerSecond         float64           `json:"prefillTokensPerSecond"`
	PrefillAttentionPairsPerSecond float64           `json:"prefillAttentionPairsPerSecond"`
	MaxNumBatchedTokens            int64             `json:"maxNumBatchedTokens"`
	DecodeStep                     duration.Duration `json:"decodeStep"`
	PrefillFilter                  string            `json:"prefillFilter"`
	InterferenceWeight             float64           `json:"interferenceWeight"`
	DecodeStallWeight              float64           `json:"decodeStallWeight"`
	QueueWeight                    float64           `json:"queueWeight"`
}

// Decider implements transfer-cost-pd-decider.
type Decider struct {
	scheduling.Named
	p      Params
	view   atomic.Pointer[NetworkView]
	filter scheduling.Filter
	key    scheduling.Key[*state]
	// now is the scheduler's clock; arrivals and remotes the requests
	// decided and those disaggregated, for the queueing term.
	now               func() time.Time
	arrivals, remotes rateMeter
	// states recycles the per-request *state once its request has ended
	// (Recycle), buffers the per-candidate arrays once its decision is
	// made (Decided): a streaming response keeps its state, emptied, but
	// not its arrays.
	states, buffers sync.Pool
}

// rateSamples is how many recent events a rateMeter holds.
const rateSamples = 64

// rateMeter measures an event rate over its last rateSamples events.
type rateMeter struct {
	mu   sync.Mutex
	at   [rateSamples]time.Time
	n, i int
}

func (m *rateMeter) add(t time.Time) {
	m.mu.Lock()
	m.at[m.i] = t
	m.i = (m.i + 1) % rateSamples
	m.n = min(m.n+1, rateSamples)
	m.mu.Unlock()
}

// rate is events per second from the oldest event held to now; 0 before
// two events.
func (m *rateMeter) rate(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n < 2 {
		return 0
	}
	span := now.Sub(m.at[(m.i-m.n+rateSamples)%rateSamples]).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(m.n-1) / span
}

// state is one request's snapshot of every candidate, taken when the data
// producers run: the latency predictions and the prefix match are recycled
// before PreRequest, where a P2P pull is decided. It lives until the
// decision is made (Decided), after p2p-source-producer's PreRequest has
// priced its pull with it.
type state struct {
	prompt     int
	candidates []*endpoints.Endpoint
	// ttft is each candidate's predicted TTFT prefilling the request
	// (seconds), own the compute time of the request's own uncached
	// tokens there, stall what that prefill adds to the steps of the
	// sequences decoding there, step its decode step, held its cached
	// prompt tokens, decodes the sequences decoding there.
	ttft, own, stall, step, decodes []float64
	// busy is when each candidate's queued prefills are done (seconds
	// from now), chunk its step while they run: a KV landing before then
	// joins a batch whose steps carry their chunks.
	busy, chunk []float64
	held        []int
	// remote is each candidate's predicted TTFT as the prefill server of
	// the last decision (+Inf for those that cannot be), for Score;
	// compared says a decision was made.
	remote   []float64
	compared bool
	// kept are the candidates the prefill filter keeps.
	kept []*endpoints.Endpoint
	// at is when the request was decided.
	at time.Time
	// owner is the decider whose pools st and buf go back to; buf holds
	// the arrays above (nil once returned).
	owner *Decider
	buf   *buffers
}

// buffers is the backing of one request's per-candidate arrays, owned by
// that request's state from Produce until its decision is made, then by
// the decider's pool: every array of the state is a slice of one of them.
type buffers struct {
	f    []float64
	held []int
	// kept is the copy of the candidates the prefill filter reads; cost
	// the decode profile's cost of each candidate (Score).
	kept []*endpoints.Endpoint
	cost []float64
}

// numbers is how many float64 arrays of the candidates' length the state
// slices out of buffers.f.
const numbers = 8

// Decided implements scheduling.DecisionScoped: every reader (the
// scheduling cycle, the director's prefill charge, a PullPays from
// another plugin's PreRequest) has run, and a streaming response would
// otherwise keep a dozen numbers per candidate until it ends.
func (st *state) Decided() { st.owner.putBuffers(st) }

// Recycle implements scheduling.Recycler: the request has ended (its
// arrays went at the decision, or go now for a request refused before it).
func (st *state) Recycle() {
	d := st.owner
	d.putBuffers(st)
	d.states.Put(st)
}

// putBuffers returns st's arrays to the pool and empties st, so that a
// read after the decision finds no candidate rather than another
// request's. The candidates the buffers held are cleared: a pooled buffer
// must not keep endpoints alive.
func (d *Decider) putBuffers(st *state) {
	b := st.buf
	*st = state{owner: d}
	if b == nil {
		return
	}
	clear(b.kept)
	b.kept = b.kept[:0]
	d.buffers.Put(b)
}

// newState is a request's state for n candidates, its arrays zeroed.
func (d *Decider) newState(n int) *state {
	st, _ := d.states.Get().(*state)
	if st == nil {
		st = &state{owner: d}
	}
	b, _ := d.buffers.Get().(*buffers)
	if b == nil {
		b = new(buffers)
	}
	st.buf = b
	b.f = slices.Grow(b.f[:0], numbers*n)[:numbers*n]
	clear(b.f)
	b.held = slices.Grow(b.held[:0], n)[:n]
	clear(b.held)
	f := b.f
	at := func(k int) []float64 { return f[k*n : (k+1)*n : (k+1)*n] }
	st.ttft, st.own, st.stall, st.step, st.decodes = at(0), at(1), at(2), at(3), at(4)
	st.remote, st.busy, st.chunk = at(5), at(6), at(7)
	st.held = b.held
	return st
}

// PrefillFinish implements scheduling.PrefillFinish: a candidate's
// predicted TTFT from the decision.
func (st *state) PrefillFinish(e *endpoints.Endpoint) (time.Time, bool) {
	i := st.index(e)
	if i < 0 {
		return time.Time{}, false
	}
	return st.at.Add(seconds(st.ttft[i])), true
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{
		KVBytesPerToken: DefaultKVBytesPerToken, BandwidthBytesPerSecond: DefaultBandwidth,
		RTT: duration.Duration(DefaultRTT), Overhead: duration.Duration(DefaultOverhead),
		PrefillTokensPerSecond: DefaultPrefillTokensPerSecond, MaxNumBatchedTokens: DefaultMaxNumBatchedTokens,
		DecodeStep: duration.Duration(DefaultDecodeStep), PrefillFilter: DefaultPrefillFilter,
		InterferenceWeight: DefaultInterferenceWeight,
	}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case p.KVBytesPerToken <= 0:
		return nil, fmt.Errorf("parameters.kvBytesPerToken must be positive, got %d", p.KVBytesPerToken)
	case !(p.BandwidthBytesPerSecond > 0) || !finite(p.BandwidthBytesPerSecond):
		return nil, fmt.Errorf("parameters.bandwidthBytesPerSecond must be positive, got %v", p.BandwidthBytesPerSecond)
	case !(p.PrefillTokensPerSecond > 0) || !finite(p.PrefillTokensPerSecond):
		return nil, fmt.Errorf("parameters.prefillTokensPerSecond must be positive, got %v", p.PrefillTokensPerSecond)
	case !(p.PrefillAttentionPairsPerSecond >= 0) || !finite(p.PrefillAttentionPairsPerSecond):
		return nil, fmt.Errorf("parameters.prefillAttentionPairsPerSecond must be a non-negative number, got %v", p.PrefillAttentionPairsPerSecond)
	case p.MaxNumBatchedTokens <= 0:
		return nil, fmt.Errorf("parameters.maxNumBatchedTokens must be positive, got %d", p.MaxNumBatchedTokens)
	case p.RTT < 0:
		return nil, fmt.Errorf("parameters.rtt must not be negative, got %v", time.Duration(p.RTT))
	case p.Overhead < 0:
		return nil, fmt.Errorf("parameters.overhead must not be negative, got %v", time.Duration(p.Overhead))
	case p.DecodeStep < 0:
		return nil, fmt.Errorf("parameters.decodeStep must not be negative, got %v", time.Duration(p.DecodeStep))
	case p.PrefillFilter == "":
		return nil, fmt.Errorf("parameters.prefillFilter must name a filter")
	case !(p.InterferenceWeight >= 0) || !finite(p.InterferenceWeight):
		return nil, fmt.Errorf("parameters.interferenceWeight must be a non-negative number, got %v", p.InterferenceWeight)
	case !(p.DecodeStallWeight >= 0) || !finite(p.DecodeStallWeight):
		return nil, fmt.Errorf("parameters.decodeStallWeight must be a non-negative number, got %v", p.DecodeStallWeight)
	case !(p.QueueWeight >= 0) || !finite(p.QueueWeight):
		return nil, fmt.Errorf("parameters.queueWeight must be a non-negative number, got %v", p.QueueWeight)
	}
	d := &Decider{Named: scheduling.NewNamed(Type, name), p: p, now: time.Now}
	if h != nil && h.Now != nil {
		d.now = h.Now
	}
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
	f, err := scheduling.LookupAs[scheduling.Filter](lookup, "prefillFilter", d.p.PrefillFilter, "a filter")
	d.filter = f
	return err
}

// Produces implements scheduling.DataDependencies.
func (d *Decider) Produces() []string { return nil }

// Consumes implements scheduling.DataDependencies.
func (d *Decider) Consumes() []string {
	return []string{prefixmatch.MatchKey.String(), latency.PredictionsKey.String()}
}

// compute is the seconds a server spends prefilling tokens with attention
// pairs.
func (d *Decider) compute(tokens, pairs float64) float64 {
	t := tokens / d.p.PrefillTokensPerSecond
	if d.p.PrefillAttentionPairsPerSecond > 0 {
		t += pairs / d.p.PrefillAttentionPairsPerSecond
	}
	return t
}

// Produce implements scheduling.DataProducer: the snapshot of every
// candidate.
func (d *Decider) Produce(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	st := d.newState(len(eps))
	st.candidates = eps
	st.prompt = req.PromptTokens
	st.at = d.now()
	d.arrivals.add(st.at)
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
		pairs := float64(endpoints.AttentionPairs(int64(st.prompt-uncached), int64(uncached)))
		l := e.Load()
		// The remote prefills computed there whose KV is still on the
		// wire are charged until the decode server's first token.
		l.PrefillTokens, l.PrefillAttention = e.PrefillBacklog(st.at)
		st.decodes[i] = float64(l.DecodeRequests + l.ExternalRunning)
		st.step[i] = time.Duration(d.p.DecodeStep).Seconds()
		wait := -1.0
		if k := predicted(preds, e, i); k >= 0 {
			if tpot := preds.Estimate(k).TPOT.Seconds(); tpot > 0 {
				st.step[i] = tpot
			}
			if f := preds.Features[k]; f.StepRemaining > 0 {
				wait = f.StepRemaining
			}
		}
		if st.decodes[i] == 0 {
			// An idle batch: a prefill step is as long as its compute.
			st.step[i], wait = 0, 0
		} else if wait < 0 {
			wait = st.step[i] / 2
		}
		if backlog := float64(l.PrefillTokens); backlog > 0 {
			st.busy[i] = wait + max(d.compute(backlog, float64(l.PrefillAttention)), math.Ceil(backlog/float64(d.p.MaxNumBatchedTokens))*st.step[i])
			c := min(backlog, float64(d.p.MaxNumBatchedTokens))
			st.chunk[i] = max(st.step[i], d.compute(c, float64(l.PrefillAttention)*c/backlog))
		}
		tokens := float64(l.PrefillTokens) + float64(uncached)
		st.own[i] = d.compute(float64(uncached), pairs)
		// The decode batch runs its steps anyway: the prefill delays it
		// only by what its chunks add beyond them (a short prompt rides
		// in a step's idle compute).
		ownSteps := math.Ceil(float64(uncached) / float64(d.p.MaxNumBatchedTokens))
		st.stall[i] = max(st.own[i], ownSteps*st.step[i]) - ownSteps*st.step[i]
		work := d.compute(tokens, float64(l.PrefillAttention)+pairs)
		steps := math.Ceil(tokens / float64(d.p.MaxNumBatchedTokens))
		st.ttft[i] = wait + max(work, steps*st.step[i])
	}
	scheduling.Write(cs, d.key, st)
	scheduling.Write(cs, scheduling.PrefillFinishKey, scheduling.PrefillFinish(st))
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

// transfer is the time to move bytes from one server to another: the
// path's round trip and the bytes at its bandwidth.
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
	// Local is the request's predicted TTFT prefilled on the decode
	// server plus the weighted cost of its prefill to the sequences
	// decoding there; Remote the best predicted TTFT with a remote prefill
	// (+Inf without a prefill server), on Prefill.
	Local, Remote time.Duration
	Prefill       *endpoints.Endpoint
}

// Compare prices the request on decode, prefilled locally and on each
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
	local, remote, prefill := d.compare(ctx, cs, req, st, j)
	st.compared = true
	return Costs{Local: seconds(local), Remote: seconds(remote), Prefill: prefill}, true
}

// prefillServers fills st.kept, once per request (none after the
// decision, when the buffers are gone).
func (d *Decider) prefillServers(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, st *state) {
	if st.kept == nil && st.buf != nil {
		st.buf.kept = append(st.buf.kept[:0], st.candidates...)
		st.kept = d.filter.Filter(ctx, cs, req, st.buf.kept)
	}
}

// compare is Compare for candidate j, in seconds; it leaves each prefill
// server's remote TTFT in st.remote.
func (d *Decider) compare(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, st *state, j int) (local, best float64, prefill *endpoints.Endpoint) {
	decode := st.candidates[j]
	local = st.ttft[j]
	if n := st.decodes[j]; n > 0 {
		// Every sequence decoding there waits out what the prefill adds
		// to its steps before its next token.
		local += (d.p.InterferenceWeight + d.p.DecodeStallWeight*n) * st.stall[j]
	}
	d.prefillServers(ctx, cs, req, st)
	// The requests reaching the server during the prefill wait for it.
	var lamDecode, lamPrefill float64
	if d.p.QueueWeight > 0 {
		decoders := max(1, len(st.candidates)-len(st.kept))
		lamDecode = d.arrivals.rate(st.at) / float64(decoders)
		lamPrefill = d.remotes.rate(st.at) / float64(max(1, len(st.kept)))
		local += d.p.QueueWeight * lamDecode * st.own[j] * st.own[j] / 2
	}
	// The decode server receives the KV of every prompt token it lacks:
	// it starts the pull at a step boundary, sees it landed at another and
	// samples in the step after.
	bytes := float64(d.p.KVBytesPerToken) * float64(prefixmatch.Uncached(st.prompt, st.held[j]))
	overhead := time.Duration(d.p.Overhead).Seconds()
	best = math.Inf(1)
	for i := range st.remote {
		st.remote[i] = math.Inf(1)
	}
	for _, p := range st.kept {
		i := st.index(p)
		if p == decode || i < 0 {
			continue
		}
		r := st.ttft[i] + d.transfer(p, decode, bytes) + overhead + d.p.QueueWeight*lamPrefill*st.own[i]*st.own[i]/2
		// Landing while the decode server still prefills its queue, the
		// KV waits out steps that carry those prefills' chunks.
		if r < st.busy[j] {
			r += 2 * st.chunk[j]
		} else {
			r += 2 * st.step[j]
		}
		st.remote[i] = r
		if r < best {
			best, prefill = r, p
		}
	}
	return local, best, prefill
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
	remote := ok && c.Prefill != nil && c.Remote < c.Local
	if remote {
		st, _ := scheduling.Read(cs, d.key)
		d.remotes.add(st.at)
	}
	return remote
}

// Score implements scheduling.Scorer. In the decode profile (before the
// decision) it rates each decode server by the cost of the request's best
// choice there, prefilled locally or remotely; in the prefill profile
// (after it) each prefill server by its predicted remote TTFT for the
// decode server chosen, or by its own predicted TTFT when no decision was
// made (stageOrder prefill-first). The lowest cost scores 1, the highest 0.
func (d *Decider) Score(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint, scores []float64) {
	st, ok := scheduling.Read(cs, d.key)
	if !ok {
		return
	}
	var cost func(e *endpoints.Endpoint) float64
	if st.compared {
		cost = func(e *endpoints.Endpoint) float64 {
			if i := st.index(e); i >= 0 && !math.IsInf(st.remote[i], 1) {
				return st.remote[i]
			}
			return math.MaxFloat64
		}
	} else {
		d.prefillServers(ctx, cs, req, st)
		if st.buf == nil {
			return // the decision is made
		}
		// By candidate index, parallel to st.candidates.
		best := slices.Grow(st.buf.cost[:0], len(st.candidates))[:len(st.candidates)]
		st.buf.cost = best
		for j := range best {
			best[j] = math.MaxFloat64
		}
		for _, e := range eps {
			j := st.index(e)
			switch {
			case j < 0:
			case slices.Contains(st.kept, e):
				// A prefill server before any decision (stageOrder
				// prefill-first): by its own predicted TTFT.
				best[j] = st.ttft[j]
			default:
				local, remote, _ := d.compare(ctx, cs, req, st, j)
				best[j] = min(local, remote)
			}
		}
		cost = func(e *endpoints.Endpoint) float64 {
			if j := st.index(e); j >= 0 {
				return best[j]
			}
			return math.MaxFloat64
		}
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
// (p2p-source-producer's pullDecider). Before Produce, and once the
// decision is made, it says no.
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
	return pull < d.compute(float64(tokens), float64(endpoints.AttentionPairs(int64(st.held[c]), int64(tokens))))
}

var (
	_ scheduling.DataProducer     = (*Decider)(nil)
	_ scheduling.DataDependencies = (*Decider)(nil)
	_ scheduling.Resolver         = (*Decider)(nil)
	_ scheduling.Scorer           = (*Decider)(nil)
	_ scheduling.PrefillFinish    = (*state)(nil)
	_ scheduling.DecisionScoped   = (*state)(nil)
)
