package latency

import (
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for zero Config fields.
const (
	DefaultQuantile     = 0.9
	DefaultForgetting   = 0.998
	DefaultMinSamples   = 16
	DefaultMaxEndpoints = 8192
	// residualForget is the weight of the newest residual in the quantile
	// estimates once they have seen that many samples' inverse.
	residualForget = 0.01
)

// Config tunes a Model.
type Config struct {
	// Quantile is the high quantile predicted beside the mean, in (0, 1).
	Quantile float64
	// Forgetting is the per-sample decay of old samples' weight, in
	// (0, 1]: 0.998 halves a sample's weight after about 350 newer ones.
	Forgetting float64
	// MinSamples is how many samples an endpoint needs before its own fit
	// replaces the pool's.
	MinSamples int
	// MaxEndpoints bounds the endpoints tracked; more share the pool fit.
	MaxEndpoints int
	// TokenBudget is the servers' per-step token budget
	// (--max-num-batched-tokens), which the engine twin schedules with.
	TokenBudget int64
	// HoldTokens is a prefill-join-hold's minTokens (0: the picker holds
	// no request): a prompt of at least this many uncached tokens routed
	// while another is in prefill there reaches the server only at the
	// last first token ahead of it, and so sits out the step that begins
	// then.
	HoldTokens int64
}

func (c Config) withDefaults() Config {
	if c.Quantile <= 0 || c.Quantile >= 1 {
		c.Quantile = DefaultQuantile
	}
	if c.Forgetting <= 0 || c.Forgetting > 1 {
		c.Forgetting = DefaultForgetting
	}
	if c.MinSamples <= 0 {
		c.MinSamples = DefaultMinSamples
	}
	if c.MaxEndpoints <= 0 {
		c.MaxEndpoints = DefaultMaxEndpoints
	}
	if c.TokenBudget <= 0 {
		c.TokenBudget = DefaultTokenBudget
	}
	return c
}

// Features describe one request on one endpoint at the decision.
type Features struct {
	// Prefill is the request's uncached prompt tokens on the endpoint,
	// Cached the prompt tokens before them that it holds.
	Prefill, Cached float64
	// Backlog is the prefill work ahead of it: uncached tokens of requests
	// routed there that have not produced a first token.
	Backlog float64
	// Attention is the causal attention pairs of the request's and the
	// backlog's prefill (endpoints.AttentionPairs): what makes long prompts
	// cost more than their length.
	Attention float64
	// Decodes and DecodeTokens are the sequences decoding there and their
	// context tokens.
	Decodes      float64
	DecodeTokens float64
	// StepRemaining is the seconds left of the decode step in progress
	// there (endpoints.Endpoint.StepRemaining): the request waits it out
	// before its prefill starts. Zero unless the endpoint is decoding with
	// no prefill in flight (prefill steps are priced by the backlog terms).
	StepRemaining float64
}

// ttftX is TTFT's feature vector: the prefill work ahead (W tokens, and
// their attention pairs), W times the decode batch (every prefill step also
// runs the decodes), and whether other prefills are in flight (then the
// step in progress, which the request waits out, is a heavy one); the
// constant is a light step in progress.
func (f *Features) ttftX() (x [maxFeatures]float64) {
	f.ttftInto(&x)
	return x
}

// ttftInto sets x to ttftX in place: a composite literal is built in a
// temporary and copied, twice per prediction (ttftOf).
func (f *Features) ttftInto(x *[maxFeatures]float64) {
	w := (f.Prefill + f.Backlog) / 1e3
	x[0], x[1], x[2], x[3], x[4], x[5] = 1, w, f.Attention/1e9, w*f.Decodes/100, f.busy(), f.StepRemaining
}

// busy is 1 while other prefills are in flight on the endpoint, else 0.
func (f *Features) busy() float64 {
	if f.Backlog > 0 {
		return 1
	}
	return 0
}

// tpotX is TPOT's: a decode step's time grows with the batch and its
// context, and with a prefill chunk sharing the step while a prefill
// backlog exists. The chunk is bounded by the server's token budget however
// long the backlog, so the backlog enters as an indicator, not its size (a
// size term learned at light load would extrapolate without bound).
func (f *Features) tpotX() [maxFeatures]float64 {
	return [maxFeatures]float64{1, f.Decodes / 100, f.DecodeTokens / 1e6, f.busy(), 0, 0}
}

// Priors: an 8B model on one modern GPU, weakly held (see rls; the twin's
// in twin.go).
var (
	ttftPrior = []float64{0.02, 0.1, 0, 0, 0, 1}
	tpotPrior = []float64{0.01, 0.01, 0, 0, 0, 0}
)

// Estimate is a prediction for one request on one endpoint.
type Estimate struct {
	TTFT, TTFTQuantile time.Duration
	TPOT, TPOTQuantile time.Duration
	// Imposed is what routing the request there adds to the TTFTs of
	// requests already routed there: the step that computes its first
	// chunk also finishes their prompts, and the chunk makes it longer
	// (twin.go). Not part of the request's own TTFT; a scorer ranks by the
	// sum. Zero where the feature model predicts.
	Imposed time.Duration
}

// coeffs is an immutable published fit.
type coeffs struct {
	ttft, tpot [maxFeatures]float64
	twin       [maxFeatures]float64 // the engine twin's step cost
	mTwin      float64
	// join is the weight of the expected joiners (joiners.go).
	join float64
	// ends is how responses end there: the share of a decoding batch
	// finishing per step and of max_tokens used (completions.go).
	ends         outputs
	twinSamples  int
	qTTFT, qTPOT float64 // log(actual/predicted) quantiles
	// mTTFT and mTPOT are exp of them: the quantile's multiple of the mean,
	// computed once per fit rather than per prediction.
	mTTFT, mTPOT float64
	ttftSamples  int
	tpotSamples  int
}

// ttftOf is the feature model's TTFT, mean and quantile.
func (c *coeffs) ttftOf(f *Features) (mean, quantile time.Duration) {
	var x [maxFeatures]float64
	f.ttftInto(&x)
	s := dot(&c.ttft, &x)
	return seconds(s), seconds(s * c.mTTFT)
}

// tpotOf is the feature model's TPOT, mean and quantile.
func (c *coeffs) tpotOf(f *Features) (mean, quantile time.Duration) {
	z := f.tpotX()
	s := dot(&c.tpot, &z)
	return seconds(s), seconds(s * c.mTPOT)
}

// minPrediction keeps a fit that went below zero in a corner of its range
// from predicting an impossible latency.
const minPrediction = 1e-4

// maxPrediction bounds a prediction: a fit gone wild must not overflow the
// conversion (which would give the most negative duration, the best score).
const maxPrediction = 24 * 3600.0

func seconds(s float64) time.Duration {
	if !(s < maxPrediction) { // also NaN
		s = maxPrediction
	}
	if s < minPrediction {
		s = minPrediction
	}
	return time.Duration(s * float64(time.Second))
}

// dot is written out: it runs several times per candidate per decision
// (the constant below stops compiling if maxFeatures changes).
func dot(a, b *[maxFeatures]float64) float64 {
	s := a[0] * b[0]
	s += a[1] * b[1]
	s += a[2] * b[2]
	s += a[3] * b[3]
	s += a[4] * b[4]
	s += a[5] * b[5]
	return s
}

const _ = uint(maxFeatures-6) + uint(6-maxFeatures)

// kind is one of the two latencies a fit models.
type kind int

const (
	ttft kind = iota
	tpot
	// twinCost is the engine twin's step cost, learned from TTFTs.
	twinCost
	kinds
)

// features is how many of the maxFeatures terms the kind uses.
func (k kind) features() int {
	switch k {
	case ttft:
		return 6
	case twinCost:
		return twinFeatures
	}
	return 4
}

// x is the kind's feature vector.
func (k kind) x(f *Features) [maxFeatures]float64 {
	if k == ttft {
		return f.ttftX()
	}
	return f.tpotX()
}

// target is the fit of one kind: the regression, its residuals' quantile
// and how many samples it has seen.
type target struct {
	reg     rls
	q       quantile
	samples int
}

// fit is one endpoint's (or the pool's) model.
type fit struct {
	mu        sync.Mutex
	t         [kinds]target // by kind
	published atomic.Pointer[coeffs]
	// used is the model's observation count when this fit last learned:
	// the least recently used fit goes when the endpoint bound is reached.
	used atomic.Int64

	// join is the learned weight of the expected joiners (joiners.go),
	// output the responses' output lengths, bounded their share of
	// max_tokens and perStep their tokens per step counted
	// (completions.go); mu guards them.
	join    float64
	output  outputMean
	bounded outputMean
	perStep outputMean

	// twinMu guards tw, the endpoint's engine twin (unused in the pool's).
	twinMu sync.Mutex
	tw     twin
}

func newFit(cfg Config, from *coeffs) *fit {
	f := &fit{join: joinPrior}
	priors := [kinds][]float64{ttftPrior, tpotPrior, twinPrior}
	if from != nil {
		// The residuals are the new endpoint's own: they start over.
		priors = [kinds][]float64{from.ttft[:], from.tpot[:], from.twin[:]}
		f.join = from.join
		// The pool's, as priors.
		if from.ends.retire > 0 {
			f.output = outputMean{mean: 1 / from.ends.retire}
		}
		f.bounded = outputMean{mean: from.ends.bounded}
		f.perStep = outputMean{mean: from.ends.perStep}
	}
	for k := range f.t {
		f.t[k] = target{reg: newRLS(kind(k).features(), cfg.Forgetting, priors[k]), q: newQuantile(cfg.Quantile, residualForget)}
	}
	f.publishLocked()
	return f
}

func (f *fit) publishLocked() { f.publishKindsLocked(1<<ttft | 1<<tpot | 1<<twinCost) }

// publishKindsLocked publishes the fit with the kinds in the bit set
// changed; the others' constrained coefficients (a solve each) are the
// published fit's.
func (f *fit) publishKindsLocked(changed int) {
	c := &coeffs{}
	if old := f.published.Load(); old != nil {
		*c = *old
	}
	if t := &f.t[ttft]; changed&(1<<ttft) != 0 {
		c.ttft, c.qTTFT, c.mTTFT, c.ttftSamples = t.reg.clamped(), t.q.value, math.Exp(t.q.value), t.samples
	}
	if p := &f.t[tpot]; changed&(1<<tpot) != 0 {
		c.tpot, c.qTPOT, c.mTPOT, c.tpotSamples = p.reg.constrained(), p.q.value, math.Exp(p.q.value), p.samples
	}
	if w := &f.t[twinCost]; changed&(1<<twinCost) != 0 {
		c.twin, c.mTwin, c.twinSamples, c.join = w.reg.constrained(), math.Exp(w.q.value), w.samples, f.join
	}
	c.ends = outputs{retire: f.output.retire(), bounded: f.bounded.mean, perStep: f.perStep.mean}
	f.published.Store(c)
}

// observe learns one sample of kind k; the residual is taken against what
// the published fit predicted, before the sample moves it.
func (f *fit) observe(k kind, feat Features, actual float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.learnLocked(k, feat, actual)
	f.publishKindsLocked(1 << k)
}

// learnLocked is observe without publishing the new fit.
func (f *fit) learnLocked(k kind, feat Features, actual float64) {
	x := k.x(&feat)
	c := f.published.Load()
	pred, _ := c.ttftOf(&feat)
	if k == tpot {
		pred, _ = c.tpotOf(&feat)
	}
	t := &f.t[k]
	if p := pred.Seconds(); p > 0 {
		t.q.observe(math.Log(actual / p))
	}
	t.reg.update(&x, actual)
	t.samples++
}

// Model predicts and learns latencies per endpoint address.
type Model struct {
	cfg  Config
	pool *fit
	// observations counts samples, the clock of fit.used.
	observations atomic.Int64
	// tickets numbers routed requests in the twins.
	tickets atomic.Uint64

	// endpoints is an immutable map replaced whole when an endpoint is
	// added or forgotten (rare), so that predictions, one per candidate
	// per decision, look fits up without a lock; mu serialises writers.
	mu        sync.Mutex
	endpoints atomic.Pointer[map[string]*fit]

	// index is the fits of the last candidate list indexed (Candidates);
	// misses counts the decisions since the last rebuild that it did not
	// serve, reindexWait how many it waits out before the next one.
	index       atomic.Pointer[fitIndex]
	misses      atomic.Uint64
	reindexWait atomic.Uint64
}

// New returns a model knowing only its priors.
func New(cfg Config) *Model {
	cfg = cfg.withDefaults()
	m := &Model{cfg: cfg, pool: newFit(cfg, nil)}
	m.endpoints.Store(&map[string]*fit{})
	return m
}

// Predict estimates a request with features f on the endpoint at addr.
// Each kind comes from the endpoint's own fit once it has MinSamples of
// that kind, else from the pool's; TPOT is 0 ("unknown": SLO checks skip
// it) until even the pool has seen MinSamples streams end.
func (m *Model) Predict(addr string, f Features) Estimate {
	pool := m.pool.published.Load()
	own := pool
	if e := (*m.endpoints.Load())[addr]; e != nil {
		own = e.published.Load()
	}
	var est Estimate
	est.TTFT, est.TTFTQuantile = m.enough(own, pool, own.ttftSamples).ttftOf(&f)
	if from := m.enough(own, pool, own.tpotSamples); from.tpotSamples >= m.cfg.MinSamples {
		est.TPOT, est.TPOTQuantile = from.tpotOf(&f)
	}
	return est
}

// ObserveTTFT learns from a request whose first token came after actual.
func (m *Model) ObserveTTFT(addr string, f Features, actual time.Duration) {
	m.observe(ttft, addr, f, actual)
}

// ObserveTPOT learns from a request whose output tokens came actual apart.
func (m *Model) ObserveTPOT(addr string, f Features, actual time.Duration) {
	m.observe(tpot, addr, f, actual)
}

func (m *Model) observe(k kind, addr string, f Features, actual time.Duration) {
	if actual <= 0 {
		return
	}
	s := actual.Seconds()
	m.pool.observe(k, f, s)
	if e := m.fitOf(addr); e != nil {
		e.used.Store(m.observations.Add(1))
		e.observe(k, f, s)
	}
}

// fitOf returns addr's fit, creating it from the pool's (and evicting the
// least recently used fit at the endpoint bound).
func (m *Model) fitOf(addr string) *fit {
	if e := (*m.endpoints.Load())[addr]; e != nil {
		return e
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *m.endpoints.Load()
	if e := cur[addr]; e != nil {
		return e
	}
	next := maps.Clone(cur)
	if len(cur) >= m.cfg.MaxEndpoints {
		// A response can still arrive for an endpoint just forgotten and
		// bring its fit back; under address churn such fits would fill the
		// bound and leave new endpoints on the pool fit. The least
		// recently used one goes instead.
		oldest, at := "", int64(math.MaxInt64)
		for a, f := range cur {
			if u := f.used.Load(); u < at {
				oldest, at = a, u
			}
		}
		delete(next, oldest)
	}
	e := newFit(m.cfg, m.pool.published.Load())
	next[addr] = e
	m.endpoints.Store(&next)
	return e
}

// Forget drops an endpoint's fit (it left the pool).
func (m *Model) Forget(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *m.endpoints.Load()
	if _, ok := cur[addr]; !ok {
		return
	}
	next := maps.Clone(cur)
	delete(next, addr)
	m.endpoints.Store(&next)
}

// Fit describes what the model learned of one endpoint.
type Fit struct {
	Address     string
	TTFTSamples int
	TPOTSamples int
	// PrefillTokensPerSecond is the learned prefill rate of an idle server.
	PrefillTokensPerSecond float64
	// DecodeStep is the learned TPOT of a lone sequence.
	DecodeStep time.Duration
	// MeanOutput is the mean output length of its completed responses
	// (the pool's until its first; 0: none seen anywhere).
	MeanOutput float64
	// BoundShare is the share of max_tokens its responses use, and
	// TokensPerStep the tokens a stream produced per step the step clock
	// counted (0: none seen; completions.go).
	BoundShare, TokensPerStep float64
	// Queued is the twin's prompts not yet past their first token and
	// Decoding its calendar's entries: both leave when their request
	// ends, so a count that only grows names a lost end.
	Queued, Decoding int
}

// Fits reports every tracked endpoint's fit, for reports and debugging.
func (m *Model) Fits() []Fit {
	eps := *m.endpoints.Load()
	out := make([]Fit, 0, len(eps))
	for addr, e := range eps {
		c := e.published.Load()
		e.mu.Lock()
		ft := Fit{Address: addr, TTFTSamples: e.t[ttft].samples, TPOTSamples: e.t[tpot].samples, DecodeStep: seconds(c.tpot[0]), MeanOutput: e.output.mean,
			BoundShare: e.bounded.mean, TokensPerStep: e.perStep.mean}
		e.mu.Unlock()
		e.twinMu.Lock()
		ft.Queued, ft.Decoding = len(e.tw.q), len(e.tw.dec)
		e.twinMu.Unlock()
		if c.ttft[1] > 0 {
			ft.PrefillTokensPerSecond = 1e3 / c.ttft[1]
		}
		out = append(out, ft)
	}
	return out
}
