// Package predictedlatency is the predicted-latency-producer: for every
// candidate it predicts the request's TTFT and TPOT (mean and a high
// quantile) with kvgate's online latency model (extproc/latency), from the
// request's uncached prompt tokens there (the prefix producer's match) and
// the endpoint's live load (extproc/endpoints), and it trains that model on
// the TTFT and TPOT observed on each response stream. It also tells the
// model's engine twin of each endpoint what it routed there, and when each
// request's first token came or its response ended. The latency scorer,
// the SLO filters and the admitter read its predictions.
//
// Parameters (llm-d's; its sidecar tuning is refused unless at its default):
//
//	sloBufferFactor: float   predictions are multiplied by it before being
//	                         compared with an SLO (default 1.0)
//	streamingMode: bool      also learn TPOT from streamed responses
//	                         (default false: TTFT only, as llm-d's default
//	                         trains on TTFT/e2e alone)
//	endpointRoleLabel: string  a label key; endpoints whose value is
//	                         "prefill" predict no TPOT (default "")
//	contextTTL: duration     a request whose first token comes later than
//	                         this is not learned from (default 5m; an
//	                         integer counts nanoseconds, as llm-d's
//	                         time.Duration field does)
//	quantile: float          the high quantile predicted (default 0.9)
//	predictInProduce: bool   must stay true (default true)
//	samplingMean: float      llm-d's TPOT sampling; kvgate measures TPOT
//	                         over the whole stream: only 1000 is accepted
//	maxDecodeTokenSamplesForPrediction: int  likewise, only 0
//	useEncoderCacheFeatures: bool  must stay false (no encoder features yet)
//	encoderCacheMatchInfoProducerName: string  must stay empty
//	prefillJoinHold: string  kvgate's own: the name of a prefill-join-hold
//	                         plugin of the configuration, whose hold the
//	                         engine twin predicts with (default "": none)
//
// Only streamed responses teach TTFT: a non-streamed response's first chunk
// is the whole response. Nor do P/D requests (scheduling.Result.Prefill):
// the decode server's first token then waits for another server's prefill
// and the KV transfer.
package predictedlatency

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/plugins/inflightload"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
)

// Type is the registered plugin type.
const Type = "predicted-latency-producer"

// Params are the plugin's parameters.
type Params struct {
	SamplingMean                       float64        `json:"samplingMean"`
	MaxDecodeTokenSamplesForPrediction int            `json:"maxDecodeTokenSamplesForPrediction"`
	SLOBufferFactor                    float64        `json:"sloBufferFactor"`
	ContextTTL                         duration.Nanos `json:"contextTTL"`
	StreamingMode                      bool           `json:"streamingMode"`
	EndpointRoleLabel                  string         `json:"endpointRoleLabel"`
	PredictInProduce                   *bool          `json:"predictInProduce"`
	UseEncoderCacheFeatures            bool           `json:"useEncoderCacheFeatures"`
	EncoderCacheMatchInfoProducerName  string         `json:"encoderCacheMatchInfoProducerName"`
	Quantile                           float64        `json:"quantile"`
	PrefillJoinHold                    string         `json:"prefillJoinHold"`
}

// Defaults.
const (
	DefaultSamplingMean    = 1000
	DefaultSLOBufferFactor = 1.0
	DefaultContextTTL      = 5 * time.Minute
)

// Producer implements predicted-latency-producer.
type Producer struct {
	scheduling.Named
	params Params
	model  *latency.Model
	rec    latency.Recorder
	now    func() time.Time
	key    scheduling.Key[*state]
	// meanPrefill is the running mean of routed requests' uncached tokens
	// (float64 bits): the size of a request the picker did not route, seen
	// only as a count in a scrape.
	meanPrefill atomic.Uint64
	// arrays recycles the per-candidate prediction arrays (*Predictions,
	// each the box its arrays travel in); states recycles the per-request
	// *state once its request has ended.
	arrays sync.Pool
	states sync.Pool
	// noTPOT is prefillOnly when a role label is configured, else nil (no
	// call per candidate).
	noTPOT func(*endpoints.Endpoint) bool
}

// state is one request's prediction for later stages, owned by the request.
// The per-candidate arrays live only until the decision is made (Decided):
// the filters, scorers and PreRequest hooks have read them by then, and
// only the chosen endpoint's estimate and features are kept, so the arrays
// go back to a pool for the next request instead of being allocated per
// decision, or kept by a streaming response until it ends.
type state struct {
	owner *Producer
	preds latency.Predictions
	// box is the pool box preds' arrays came in; nil for new arrays.
	box    *latency.Predictions
	target *endpoints.Endpoint // nil until PreRequest
	est    latency.Estimate
	// feat is the chosen candidate's features and the engine twin's
	// projection there (latency.Model.Sample).
	feat latency.Sample
	// decided is when Produce predicted, routed when PreRequest ran.
	decided, routed time.Time
	// tpotFor is the decode batch the request joined at its first token.
	tpotFor latency.Features
	ttft    time.Duration
	// remote is set when another server computed the prompt (P/D): the
	// decode server's TTFT then says nothing of its own prefill speed.
	remote bool
	// ticket is the request's place in the target's engine twin.
	ticket latency.Ticket
	// choices is the body's n (OpenAI's choices per prompt; 1 when it
	// sets none, or on the headers-only path, which carries no body).
	choices int
}

// Decided implements scheduling.DecisionScoped: the arrays go back to the
// pool after every PreRequest hook, whichever reads them (the predictions
// are other plugins' to read, under latency.PredictionsKey) and whether or
// not the producer's own PreRequest found its target among them.
func (st *state) Decided() { st.owner.putArrays(st) }

// Recycle implements scheduling.Recycler: the request has ended. Its
// place in the twin goes too (a no-op after ResponseComplete ended it): a
// driver that releases the state without the response hooks must not
// leave the entry to age out of the queue or calendar.
func (st *state) Recycle() {
	p := st.owner
	p.model.Ended(&st.ticket)
	p.putArrays(st)
	*st = state{owner: p}
	p.states.Put(st)
}

// putArrays returns st's per-candidate arrays to the pool, once: at the
// decision, or at the request's end for one refused before it (or driven
// by code that does not report it).
func (p *Producer) putArrays(st *state) {
	if st.preds.Estimates == nil {
		return
	}
	box := st.box
	if box == nil {
		box = new(latency.Predictions)
	}
	*box = st.preds
	box.Candidates = nil
	st.preds, st.box = latency.Predictions{}, nil
	p.arrays.Put(box)
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	p := Params{SamplingMean: DefaultSamplingMean, SLOBufferFactor: DefaultSLOBufferFactor, ContextTTL: duration.Nanos(DefaultContextTTL), Quantile: latency.DefaultQuantile}
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	switch {
	case p.SamplingMean != DefaultSamplingMean || p.MaxDecodeTokenSamplesForPrediction != 0:
		return nil, fmt.Errorf("parameters.samplingMean and maxDecodeTokenSamplesForPrediction tune llm-d's TPOT sampling; kvgate measures TPOT over the whole stream and accepts only their defaults (%d, 0)", DefaultSamplingMean)
	case p.PredictInProduce != nil && !*p.PredictInProduce:
		return nil, fmt.Errorf("parameters.predictInProduce: kvgate always predicts in the producer; false is not supported")
	case p.UseEncoderCacheFeatures || p.EncoderCacheMatchInfoProducerName != "":
		return nil, fmt.Errorf("parameters.useEncoderCacheFeatures / encoderCacheMatchInfoProducerName: encoder-cache features are not supported")
	case p.SLOBufferFactor <= 0 || math.IsNaN(p.SLOBufferFactor):
		return nil, fmt.Errorf("parameters.sloBufferFactor must be positive, got %v", p.SLOBufferFactor)
	case p.ContextTTL <= 0:
		return nil, fmt.Errorf("parameters.contextTTL must be positive")
	case p.Quantile <= 0 || p.Quantile >= 1:
		return nil, fmt.Errorf("parameters.quantile must be in (0, 1), got %v", p.Quantile)
	}
	pr := &Producer{
		Named:  scheduling.NewNamed(Type, name),
		params: p,
		model:  latency.New(p.modelConfig(0)),
		now:    scheduling.NowOf(h),
	}
	if h != nil {
		pr.rec = latency.RecorderFrom(h.Services)
	} else {
		pr.rec = latency.RecorderFrom(nil)
	}
	if p.EndpointRoleLabel != "" {
		pr.noTPOT = pr.prefillOnly
	}
	pr.key = scheduling.NewKey[*state](pr.TypedName().String())
	pr.states.New = func() any { return &state{owner: pr} }
	pr.meanPrefill.Store(math.Float64bits(1000))
	return pr, nil
}

// modelConfig is the latency model's configuration under p, with a
// prefill-join-hold of minimum holdTokens (0: none).
func (p Params) modelConfig(holdTokens int) latency.Config {
	return latency.Config{Quantile: p.Quantile, HoldTokens: int64(holdTokens)}
}

// joinHold is what the producer reads of a prefill-join-hold.
type joinHold interface{ MinTokens() int }

// Resolve implements scheduling.Resolver: the model predicts with the
// named prefill-join-hold's hold. It runs once, before any request.
func (p *Producer) Resolve(lookup func(string) (scheduling.Plugin, bool)) error {
	if p.params.PrefillJoinHold == "" {
		return nil
	}
	h, err := scheduling.LookupAs[joinHold](lookup, "prefillJoinHold", p.params.PrefillJoinHold, "a prefill-join-hold")
	if err != nil {
		return err
	}
	p.model = latency.New(p.params.modelConfig(h.MinTokens()))
	return nil
}

// Model is the producer's latency model.
func (p *Producer) Model() *latency.Model { return p.model }

// Produces implements scheduling.DataDependencies.
func (p *Producer) Produces() []string { return []string{latency.PredictionsKey.String()} }

// Consumes implements scheduling.DataDependencies: the prefix match, when
// a prefix producer is configured, and the in-flight load snapshot.
func (p *Producer) Consumes() []string {
	return []string{prefixmatch.MatchKey.String(), inflightload.Key.String()}
}

// Produce implements scheduling.DataProducer.
func (p *Producer) Produce(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) {
	st := p.states.Get().(*state)
	if pooled, ok := p.arrays.Get().(*latency.Predictions); ok {
		st.preds, st.box = *pooled, pooled
	}
	st.preds.Resize(eps) // every element is written below
	st.preds.BufferFactor = p.params.SLOBufferFactor
	match, _ := scheduling.Read(cs, prefixmatch.MatchKey)
	aligned := match != nil && sameCandidates(match.Candidates(), eps)
	holds := match != nil && match.Holds()
	loads, _ := scheduling.Read(cs, inflightload.Key)
	loadsAligned := loads != nil && sameCandidates(loads.Candidates, eps)
	meanPrefill := math.Float64frombits(p.meanPrefill.Load())
	prompt := req.PromptTokens
	if match != nil {
		prompt = match.Prompt(prompt)
	}
	prompt = max(1, prompt)
	now := p.now()
	fits, nowNanos := p.model.Candidates(eps), now.UnixNano()
	// Most candidates hold none of the prompt: their request terms are
	// computed once.
	none := shapeOf(prompt, 0)
	feats, ests, shares := st.preds.Features[:len(eps)], st.preds.Estimates[:len(eps)], st.preds.Held[:len(eps)]
	var own endpoints.Load // a candidate's load, read here without a snapshot
	var live latency.Engine
	for i, e := range eps {
		held := 0
		switch {
		case !holds:
		case aligned:
			held = match.HeldTokens(i)
		case match != nil:
			held = match.HeldTokensOf(e)
		}
		sh, share := none, 0.0
		if held != 0 {
			sh, share = shapeOf(prompt, held), float64(held)/float64(prompt)
		}
		l := &own
		if loadsAligned {
			l = &loads.Loads[i]
		} else {
			own = e.Load()
		}
		f := &feats[i]
		sh.features(f, l, meanPrefill)
		if f.Backlog == 0 && l.DecodeRequests > 0 {
			f.StepRemaining = e.StepRemaining(now).Seconds()
		}
		// What the engine twin reads beside its queue; it does not answer
		// beside traffic the picker did not route (nil).
		var eng *latency.Engine
		if l.ExternalWaiting+l.ExternalRunning == 0 {
			live = engineOf(e, l)
			eng = &live
		}
		fits.PredictTTFT(i, e, f, nowNanos, eng, &ests[i])
		shares[i] = share
	}
	st.preds.DeferTPOT(fits, p.noTPOT)
	st.decided = now
	scheduling.Write(cs, p.key, st)
	scheduling.Write(cs, latency.PredictionsKey, &st.preds)
}

// shape is a request's terms of the features on an endpoint holding some
// of its prompt: its uncached and cached tokens there and their attention
// pairs.
type shape struct {
	prefill, cached float64
	pairs           int64
}

// shapeOf is the shape of a request with prompt tokens, held of them
// cached.
func shapeOf(prompt, held int) shape {
	uncached := prefixmatch.Uncached(prompt, held)
	return shape{prefill: float64(uncached), cached: float64(prompt - uncached),
		pairs: endpoints.AttentionPairs(int64(prompt-uncached), int64(uncached))}
}

// features sets f to describe the request on an endpoint with load l.
// Requests the picker did not route count by the mean size of those it
// did.
// Field by field: a composite literal would be built in a temporary and
// copied (once per candidate per decision); every field is written (the
// size check below fails when one is added).
func (s shape) features(f *latency.Features, l *endpoints.Load, meanPrefill float64) {
	f.Prefill = s.prefill
	f.Cached = s.cached
	f.Backlog = float64(l.PrefillTokens) + float64(l.ExternalWaiting)*meanPrefill
	f.Attention = float64(s.pairs + l.PrefillAttention)
	f.Decodes = float64(l.DecodeRequests + l.ExternalRunning)
	f.DecodeTokens = float64(l.DecodeTokens) + float64(l.ExternalRunning)*meanPrefill
	f.StepRemaining = 0
}

const _ = uint(unsafe.Sizeof(latency.Features{})-7*8) + uint(7*8-unsafe.Sizeof(latency.Features{}))

// engineOf is what the latency model's engine twin reads of e beside its
// queue.
func engineOf(e *endpoints.Endpoint, l *endpoints.Load) latency.Engine {
	return latency.Engine{Decodes: float64(l.DecodeRequests), DecodeTokens: float64(l.DecodeTokens),
		StepEnd: e.LastStep(), External: float64(l.ExternalWaiting + l.ExternalRunning), Steps: e.Steps()}
}

func (p *Producer) prefillOnly(e *endpoints.Endpoint) bool {
	return p.params.EndpointRoleLabel != "" && e.Label(p.params.EndpointRoleLabel) == "prefill"
}

// sameCandidates reports whether another producer's per-candidate data is
// indexed like eps: every producer of a request gets the same slice.
func sameCandidates(a, b []*endpoints.Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// PreRequest implements scheduling.PreRequest: it remembers the chosen
// endpoint's features for training and reports the prediction.
func (p *Producer) PreRequest(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Result) {
	st, ok := scheduling.Read(cs, p.key)
	primary := res.Primary()
	if !ok || primary == nil || len(primary.Targets) == 0 {
		return
	}
	target := primary.Targets[0]
	chosen := -1
	for k, c := range st.preds.Candidates {
		if c == target {
			chosen = k
			break
		}
	}
	if chosen < 0 {
		return
	}
	st.target, st.est = target, st.preds.Estimate(chosen)
	f := st.preds.Features[chosen]
	st.remote = res.Prefill != nil
	st.routed = p.now()
	st.choices = choicesOf(req)
	if st.remote {
		st.feat = latency.Sample{Features: f}
	} else {
		// The twin's projection at the decision, for learning: only the
		// chosen candidate's is needed, so Produce does not keep one per
		// candidate. The endpoint's state since the decision differs by
		// this request's charge, which the twin does not read.
		l := target.Load()
		st.feat = p.model.Sample(target.Address(), f, st.decided, engineOf(target, &l))
		st.ticket = p.model.Routed(target.Address(), st.routed, int(f.Cached), int(f.Prefill), req.MaxTokens)
	}
	const alpha = 0.05
	old := math.Float64frombits(p.meanPrefill.Load())
	p.meanPrefill.Store(math.Float64bits(old + alpha*(f.Prefill-old)))
	p.rec.Predicted(req.ID, req.TargetModel, st.est)
}

// FirstToken implements scheduling.FirstToken: TTFT is learned, and the
// decode batch the request joins is captured for TPOT.
func (p *Producer) FirstToken(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Response) {
	now := p.now()
	if st, ok := scheduling.Read(cs, p.key); ok && st.target != nil {
		if res.Endpoint == st.target {
			l := st.target.Load()
			p.model.FirstTokenAt(&st.ticket, now, engineOf(st.target, &l), &st.feat)
		} else {
			p.model.Ended(&st.ticket) // a fallback served it: no step of the target ended
		}
	}
	st, ok := p.trained(cs, res)
	if !ok || !req.Stream {
		return
	}
	est, f := st.est, st.feat
	if now.Sub(st.routed) > time.Duration(p.params.ContextTTL) {
		return
	}
	st.ttft = res.TTFT
	if !st.remote {
		p.model.ObserveFirstToken(res.Endpoint.Address(), f, now, res.TTFT, now.Sub(st.routed))
		p.rec.ObservedTTFT(req.ID, req.TargetModel, est.TTFT, res.TTFT)
	}
	l := res.Endpoint.Load()
	shapeOf(max(1, req.PromptTokens), 0).features(&st.tpotFor, &l, math.Float64frombits(p.meanPrefill.Load()))
}

// ResponseComplete implements scheduling.ResponseComplete: TPOT is learned
// in streaming mode, from the batch the request joined at its first token.
func (p *Producer) ResponseComplete(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Response) {
	st, ok := p.trained(cs, res)
	if ok && res.Complete && req.Stream {
		// How many tokens a step counted: only a stream's chunks count
		// its steps (a response sent whole has its first chunk at its end,
		// and the steps other streams ended while it was relayed would
		// teach all its tokens to one or two of them).
		p.model.Finished(&st.ticket, st.target.Steps(), res.Usage.CompletionTokens, st.choices)
	} else if other, found := scheduling.Read(cs, p.key); found {
		p.model.Ended(&other.ticket)
	}
	if ok && res.Complete {
		// How long responses run there, and how much of their bound: the
		// twin frees a full batch's places by them.
		p.model.ObserveOutput(res.Endpoint.Address(), res.Usage.CompletionTokens, st.choices, req.MaxTokens)
	}
	if !ok || st.ttft == 0 || res.TPOT <= 0 || !res.Complete {
		return
	}
	if p.prefillOnly(res.Endpoint) {
		return
	}
	p.rec.ObservedTPOT(req.ID, req.TargetModel, st.est.TPOT, res.TPOT)
	if p.params.StreamingMode {
		p.model.ObserveTPOT(res.Endpoint.Address(), st.tpotFor, res.TPOT)
	}
}

// maxChoices bounds the n read from a body: past it a value is no count
// of sequences a server would run.
const maxChoices = 128

// choicesOf is the sequences req's response runs as on the server: its
// body's n, or 1 where it sets none or one out of range (servers refuse
// those, so no usage teaches anything then).
func choicesOf(req *scheduling.Request) int {
	if req.Body == nil {
		return 1
	}
	raw := req.Body.RawField("n")
	if raw == nil {
		return 1
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil || n < 1 || n > maxChoices {
		return 1
	}
	return n
}

// trained returns the request's state when the response is a success from
// the endpoint the prediction was for: a fallback's latency says nothing
// about the features computed for the primary.
func (p *Producer) trained(cs *scheduling.CycleState, res *scheduling.Response) (*state, bool) {
	st, ok := scheduling.Read(cs, p.key)
	if !ok || st.target == nil || res.Endpoint != st.target {
		return nil, false
	}
	// An error answers fast exactly when a server is overloaded (429,
	// 503): learning from it would teach "busy is fast" and send it more.
	if res.Status != 0 && (res.Status < 200 || res.Status > 299) {
		return nil, false
	}
	return st, true
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (p *Producer) EndpointsRemoved(addresses []string) {
	for _, a := range addresses {
		p.model.Forget(a)
	}
}

var (
	_ scheduling.DataProducer     = (*Producer)(nil)
	_ scheduling.DataDependencies = (*Producer)(nil)
	_ scheduling.PreRequest       = (*Producer)(nil)
	_ scheduling.FirstToken       = (*Producer)(nil)
	_ scheduling.ResponseComplete = (*Producer)(nil)
	_ scheduling.EndpointsRemoved = (*Producer)(nil)
	_ scheduling.Resolver         = (*Producer)(nil)
	_ scheduling.DecisionScoped   = (*state)(nil)
	_ scheduling.Recycler         = (*state)(nil)
)
