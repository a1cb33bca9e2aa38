package director

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/metrics"
	"github.com/kvgate/kvgate/extproc/saturation"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/hints"
)

// Pool is what the director needs of the endpoint datastore.
type Pool interface {
	// Candidates are the healthy endpoints.
	Candidates() []*endpoints.Endpoint
	// ByAddress finds an endpoint by ip:port; nil when unknown.
	ByAddress(addr string) *endpoints.Endpoint
}

// Objectives resolves an InferenceObjective name to its priority.
type Objectives interface {
	Priority(name string) (priority int, ok bool)
}

// Hooks are the request-lifecycle plugins of a configuration.
type Hooks struct {
	PreRequest       []scheduling.PreRequest
	ResponseComplete []scheduling.ResponseComplete
}

// Options configures a Director. Pool and Scheduler are required.
type Options struct {
	Pool      Pool
	Scheduler *scheduling.Scheduler
	Hooks     Hooks
	// Saturation sheds sheddable requests while the pool is saturated; nil
	// disables shedding.
	Saturation *saturation.Detector
	// Objectives resolves priorities; nil means every request has priority 0.
	Objectives Objectives
	// TrustFilterHints makes requests without a body route on the
	// x-kvgate-* headers kvgate's wasm filter sets (the headers-only fast
	// path). Only safe behind a proxy that runs the filter, which strips
	// client-sent copies: otherwise a client could forge its routing.
	TrustFilterHints bool
	// Metrics may be nil.
	Metrics *metrics.Metrics
	// Now is the clock for latency measurements; default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Director implements server.Director.
type Director struct {
	opts Options
	now  func() time.Time
	log  *slog.Logger
}

var _ server.Director = (*Director)(nil)

// New returns a Director.
func New(opts Options) *Director {
	d := &Director{opts: opts, now: opts.Now, log: opts.Logger}
	if d.now == nil {
		d.now = time.Now
	}
	if d.log == nil {
		d.log = slog.Default()
	}
	return d
}

// maxTokensCharged caps a request's max_tokens in in-flight accounting: a
// 4M-token context, the token-load scorer's saturation point.
const maxTokensCharged = 4 << 20

// DroppedReason values sent in x-llm-d-request-dropped-reason.
const (
	DroppedSaturated = "saturated"
	DroppedFiltered  = "filtered"
)

// requestState is one request's lifecycle state, owned by its stream.
type requestState struct {
	sched    *scheduling.Request
	cs       *scheduling.CycleState
	result   *scheduling.Result
	charged  *endpoints.Endpoint
	tokens   int64
	status   int
	chunks   int
	first    time.Time
	last     time.Time
	released bool
}

// HandleRequest implements server.Director.
func (d *Director) HandleRequest(ctx context.Context, req *server.Request) (*server.Decision, error) {
	sr := d.schedulingRequest(req)
	if d.opts.Metrics != nil {
		d.opts.Metrics.RequestReceived(sr.IncomingModel, sr.TargetModel, sr.Priority)
	}
	dec, err := d.decide(ctx, req, sr)
	if err != nil {
		e := inferr.As(err)
		if d.opts.Metrics != nil {
			d.opts.Metrics.RequestError(sr.IncomingModel, sr.TargetModel, string(e.Code))
		}
		return nil, e
	}
	return dec, nil
}

func (d *Director) decide(ctx context.Context, req *server.Request, sr *scheduling.Request) (*server.Decision, error) {
	candidates := subset(d.opts.Pool.Candidates(), req.SubsetHint)
	if len(candidates) == 0 {
		// GIE's 500 is for a request that has no body at all; a request
		// whose body the wasm filter described is an ordinary request.
		if req.HeaderOnly && req.Parsed == nil && sr.IncomingModel == "" {
			return nil, &inferr.Error{Code: inferr.Internal, Msg: "no endpoints available for a request without a body"}
		}
		return nil, inferr.New(inferr.ServiceUnavailable, "no candidate endpoints for the request")
	}
	if sr.Priority < 0 && d.opts.Saturation != nil && d.opts.Saturation.Saturated(candidates) {
		return nil, &inferr.Error{Code: inferr.InferencePoolResourceExhausted, Msg: "pool is saturated and the request is sheddable", DroppedReason: DroppedSaturated}
	}

	cs := scheduling.NewCycleState()
	start := time.Now()
	res, err := d.opts.Scheduler.Schedule(ctx, cs, sr, candidates)
	if d.opts.Metrics != nil {
		d.opts.Metrics.SchedulerDuration(time.Since(start))
	}
	switch {
	case errors.Is(err, scheduling.ErrNoCandidates):
		return nil, inferr.New(inferr.ServiceUnavailable, "no candidate endpoints for the request")
	case errors.Is(err, scheduling.ErrAllFiltered):
		return nil, &inferr.Error{Code: inferr.InferencePoolResourceExhausted, Msg: "no endpoint passed the scheduling filters", DroppedReason: DroppedFiltered}
	case err != nil:
		return nil, inferr.New(inferr.Internal, "scheduling failed: %v", err)
	}
	for _, h := range d.opts.Hooks.PreRequest {
		hs := time.Now()
		h.PreRequest(ctx, cs, sr, res)
		if d.opts.Metrics != nil {
			d.opts.Metrics.PluginDuration(scheduling.PointPreRequest, h.TypedName(), time.Since(hs))
		}
	}

	targets := res.Primary().Targets
	st := &requestState{sched: sr, cs: cs, result: res, charged: targets[0], tokens: sr.TokenEstimate()}
	st.charged.AddInflight(1, st.tokens)
	req.State = st

	dec := &server.Decision{Endpoints: make([]string, len(targets)), Headers: res.Headers}
	for i, t := range targets {
		dec.Endpoints[i] = t.Address()
	}
	if req.ModelRewrite != "" {
		dec.TargetModel = req.ModelRewrite
	}
	return dec, nil
}

// schedulingRequest is what plugins see of req.
func (d *Director) schedulingRequest(req *server.Request) *scheduling.Request {
	sr := &scheduling.Request{
		ID:         req.ID,
		Headers:    req.Headers,
		Body:       req.Parsed,
		FairnessID: req.FairnessID,
	}
	if p := req.Parsed; p != nil {
		sr.IncomingModel = p.Model
		sr.Stream = p.Stream
		sr.MaxTokens = p.MaxTokens
		sr.PromptTokens = len(p.PromptTokenIDs)
		if sr.PromptTokens == 0 {
			sr.PromptTokens = hints.EstimateTokens(len(p.PromptText()))
		}
	} else if d.opts.TrustFilterHints {
		d.applyHints(req, sr)
	}
	// A client's max_tokens counts toward the endpoint's in-flight load
	// until the response ends; an absurd value must not make one endpoint
	// look saturated (servers cap it at the context length anyway).
	sr.MaxTokens = min(sr.MaxTokens, maxTokensCharged)
	sr.TargetModel = sr.IncomingModel
	if req.ModelRewrite != "" {
		sr.TargetModel = req.ModelRewrite
	}
	if d.opts.Objectives != nil && req.Objective != "" {
		if p, ok := d.opts.Objectives.Priority(req.Objective); ok {
			sr.Priority = p
		}
	}
	return sr
}

// applyHints fills sr from the wasm filter's headers. A request the filter
// left untagged routes on load alone; a malformed tag (the filter and the
// picker disagree on the format) is logged and ignored the same way.
func (d *Director) applyHints(req *server.Request, sr *scheduling.Request) {
	h, err := hints.Decode(func(name string) (string, bool) {
		v, ok := req.Headers[name]
		return v, ok
	})
	if err != nil {
		if !errors.Is(err, hints.ErrNoHints) {
			d.log.Warn("ignoring malformed filter headers", "request_id", req.ID, "error", err)
		}
		return
	}
	sr.IncomingModel = h.Model
	sr.Stream = h.Stream
	sr.PromptTokens = h.PromptLen
	sr.MaxTokens = h.MaxTokens
	sr.Prefix = h.Prefix
}

// subset applies the proxy's subset hint: nil allows all, empty allows
// none, otherwise the endpoints whose IP appears in the hint. The protocol
// matches on IP: a hint entry's port (a service port, or one rank of a
// data-parallel pod) does not narrow it further.
func subset(eps []*endpoints.Endpoint, hint []string) []*endpoints.Endpoint {
	if hint == nil {
		return eps
	}
	if len(hint) == 0 {
		return nil
	}
	allowed := make(map[netip.Addr]bool, len(hint))
	for _, h := range hint {
		h = strings.TrimSpace(h)
		if ap, err := netip.ParseAddrPort(h); err == nil {
			allowed[ap.Addr().Unmap()] = true
		} else if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
			allowed[a.Unmap()] = true
		}
	}
	var out []*endpoints.Endpoint
	for _, e := range eps {
		if ap, err := netip.ParseAddrPort(e.Address()); err == nil && allowed[ap.Addr().Unmap()] {
			out = append(out, e)
		}
	}
	return out
}

// ResponseStarted implements server.Director.
func (d *Director) ResponseStarted(_ context.Context, req *server.Request, status int, _ map[string]string) {
	if st, ok := req.State.(*requestState); ok {
		st.status = status
	}
}

// ResponseChunk implements server.Director: the first body chunk marks the
// first token; later chunks of a stream measure inter-chunk latency.
func (d *Director) ResponseChunk(_ context.Context, req *server.Request, chunk []byte) {
	st, ok := req.State.(*requestState)
	if !ok || len(chunk) == 0 {
		return
	}
	now := d.now()
	st.chunks++
	if st.chunks == 1 {
		st.first = now
		if d.opts.Metrics != nil {
			d.opts.Metrics.TTFT(st.sched.IncomingModel, st.sched.TargetModel, now.Sub(req.ReceivedAt))
		}
	} else if st.sched.Stream && d.opts.Metrics != nil {
		d.opts.Metrics.ITL(st.sched.IncomingModel, st.sched.TargetModel, now.Sub(st.last))
	}
	st.last = now
}

// ResponseDone implements server.Director.
func (d *Director) ResponseDone(ctx context.Context, req *server.Request, sum server.ResponseSummary) {
	st, ok := req.State.(*requestState)
	if !ok || st.released {
		return
	}
	st.released = true
	st.charged.AddInflight(-1, -st.tokens)

	served := st.charged
	if sum.ServedEndpoint != "" && sum.ServedEndpoint != served.Address() {
		if e := d.opts.Pool.ByAddress(sum.ServedEndpoint); e != nil {
			served = e
		}
	}
	if m := d.opts.Metrics; m != nil && sum.Complete {
		if sum.UsageFound {
			m.Usage(st.sched.IncomingModel, st.sched.TargetModel, sum.Usage)
			// Time per output token needs tokens spread over time: only a
			// streamed response shows when its tokens were produced.
			if n := sum.Usage.CompletionTokens; sum.Streaming && n > 1 && st.chunks > 0 {
				m.TPOT(st.sched.IncomingModel, st.sched.TargetModel, st.last.Sub(st.first)/time.Duration(n-1))
			}
		}
	}
	res := &scheduling.Response{Endpoint: served, Status: sum.Status, Usage: sum.Usage, Complete: sum.Complete}
	for _, h := range d.opts.Hooks.ResponseComplete {
		h.ResponseComplete(ctx, st.cs, st.sched, res)
	}
}
