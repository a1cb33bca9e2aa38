package director

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/metrics"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/openai"
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

// ModelRewrites resolves a request's model through InferenceModelRewrites.
type ModelRewrites interface {
	RewriteModel(model string) (target, rewrite string, ok bool)
}

// Hooks are the request-lifecycle plugins of a configuration.
type Hooks struct {
	RequestHeader    []scheduling.RequestHeader
	ResponseHeader   []scheduling.ResponseHeader
	ResponseMetadata []scheduling.ResponseMetadata
	PreRequest       []scheduling.PreRequest
	FirstToken       []scheduling.FirstToken
	ResponseComplete []scheduling.ResponseComplete
	Hold             []scheduling.Holder
}

// Saturation tells whether the pool can take more work; without flow
// control the director sheds sheddable requests while it cannot.
type Saturation interface {
	Saturated(eps []*endpoints.Endpoint) bool
}

// Admission is the flow-control layer (extproc/flowcontrol's Gate) as the
// director uses it.
type Admission interface {
	// Admit holds the request until dispatch runs it (nil) or it is
	// refused (a *flowcontrol.Error).
	Admit(ctx context.Context, req flowcontrol.Request, dispatch func(*flowcontrol.Item)) error
	// Notify says live load was released: a queued request may fit now.
	Notify()
	// Track and Finished bracket a dispatched request's response, for
	// eviction.
	Track(it *flowcontrol.Item, revoke func())
	Finished(it *flowcontrol.Item)
}

// Options configures a Director. Pool and Scheduler are required.
type Options struct {
	Pool      Pool
	Scheduler *scheduling.Scheduler
	Hooks     Hooks
	// Saturation sheds sheddable requests while the pool is saturated; nil
	// disables shedding. Unused with Admission, which queues them instead.
	Saturation Saturation
	// Admission, when set, is the flow-control layer every request passes
	// before scheduling.
	Admission Admission
	// Objectives resolves priorities; nil means every request has priority 0.
	Objectives Objectives
	// Rewrites resolves model rewrites for requests without an
	// x-llm-d-model-name-rewrite header (which wins); nil: none.
	Rewrites ModelRewrites
	// TrustFilterHints makes requests without a body route on the
	// x-kvgate-* headers kvgate's wasm filter sets (the headers-only fast
	// path). Only safe behind a proxy that runs the filter, which strips
	// client-sent copies: otherwise a client could forge its routing.
	TrustFilterHints bool
	// EnginePriority writes each request's priority, negated, into the
	// body of chat and completions requests as vLLM's "priority" (lower is
	// scheduled first), for model servers run with --scheduling-policy
	// priority: the objective's priority then also orders the engine's
	// waiting queue. Off by default: vLLM under fcfs refuses a non-zero
	// priority.
	EnginePriority bool
	// DriverHolds leaves a Holder's hold to the caller, which waits for
	// the exchange's Hold itself (the cluster benchmark, on its virtual
	// clock); HandleRequest otherwise waits before it returns. Dispatch
	// never waits.
	DriverHolds bool
	// Metrics may be nil.
	Metrics *metrics.Metrics
	// Now is the clock for latency measurements; default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Director implements server.Director.
type Director struct {
	opts    Options
	now     func() time.Time
	log     *slog.Logger
	metrics *metrics.Metrics // nil-safe: a nil recorder records nothing
}

var _ server.Director = (*Director)(nil)

// New returns a Director.
func New(opts Options) *Director {
	d := &Director{opts: opts, now: opts.Now, log: opts.Logger, metrics: opts.Metrics}
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

// Refusals are reported with llm-d's x-llm-d-request-dropped-reason values
// (internal/eppwire): a sheddable request on a saturated pool, filters that
// leave no endpoint and an admitter's refusal are all rejected-saturated
// (429), as llm-d reports them; an empty pool is rejected-no-endpoints (503).

// HandleRequest implements server.Director.
func (d *Director) HandleRequest(ctx context.Context, req *server.Request) (*server.Decision, server.Exchange, error) {
	sr := d.schedulingRequest(req)
	d.requestHeader(ctx, sr)
	var (
		dec *server.Decision
		ex  *exchange
		err error
	)
	if adm := d.opts.Admission; adm != nil {
		if ferr := adm.Admit(ctx, FlowRequest(req, sr), func(it *flowcontrol.Item) {
			dec, ex, err = d.dispatch(ctx, req, sr, it)
		}); ferr != nil {
			err = FlowError(ferr)
		}
	} else {
		dec, ex, err = d.decide(ctx, req, sr)
	}
	sdec, sx, err := d.routed(req, sr, dec, ex, err)
	if err == nil && !d.opts.DriverHolds {
		if err := ex.awaitHold(ctx); err != nil {
			return nil, nil, err
		}
	}
	return sdec, sx, err
}

// routed counts a decision. A refusal is an error, not a request, as llm-d
// counts them (the dashboards' error rate is errors over routed requests);
// a routed request runs until its exchange ends.
func (d *Director) routed(req *server.Request, sr *scheduling.Request, dec *server.Decision, ex *exchange, err error) (*server.Decision, server.Exchange, error) {
	labels := metrics.Labels{Model: sr.IncomingModel, Target: sr.TargetModel, FairnessID: sr.FairnessID, Priority: sr.Priority}
	if !req.ReceivedAt.IsZero() {
		d.metrics.RequestProcessing(time.Since(req.ReceivedAt))
	}
	if err != nil {
		var ie *inferr.Error
		if !errors.As(err, &ie) && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			// The stream ended while the request was scheduled: the
			// server ends the stream on it, and it is no refusal.
			return nil, nil, err
		}
		e := inferr.As(err)
		d.metrics.RequestError(labels, string(e.Code))
		return nil, nil, e
	}
	d.metrics.RequestReceived(labels, requestSize(req))
	ex.labels = labels
	d.metrics.Running(labels, 1)
	return dec, ex, nil
}

// Classify is the scheduling request the director makes of req and what
// flow control knows of it, for drivers that run the flow-control layer
// themselves (the cluster benchmark on its virtual clock) and then call
// Dispatch.
func (d *Director) Classify(req *server.Request) (*scheduling.Request, flowcontrol.Request) {
	sr := d.schedulingRequest(req)
	d.requestHeader(context.Background(), sr)
	return sr, FlowRequest(req, sr)
}

// requestHeader runs the RequestHeader hooks on a new request.
func (d *Director) requestHeader(ctx context.Context, sr *scheduling.Request) {
	for _, h := range d.opts.Hooks.RequestHeader {
		start := time.Now()
		h.RequestHeader(ctx, sr)
		d.metrics.PluginDuration(scheduling.PointRequestHeader, h.TypedName(), time.Since(start))
	}
}

// Dispatch routes a request that flow control has dispatched as it (nil
// when the driver runs none), registering it for eviction with the
// director's Admission.
func (d *Director) Dispatch(ctx context.Context, req *server.Request, sr *scheduling.Request, it *flowcontrol.Item) (*server.Decision, server.Exchange, error) {
	dec, ex, err := d.dispatch(ctx, req, sr, it)
	return d.routed(req, sr, dec, ex, err)
}

func (d *Director) dispatch(ctx context.Context, req *server.Request, sr *scheduling.Request, it *flowcontrol.Item) (*server.Decision, *exchange, error) {
	dec, ex, err := d.decide(ctx, req, sr)
	if err == nil && it != nil && d.opts.Admission != nil {
		ex.flow, ex.revoked = it, make(chan struct{})
		d.opts.Admission.Track(it, ex.revoke)
	}
	return dec, ex, err
}

// requestSize is the request body's length: the body the picker read, or
// the content-length a headers-only request announced; -1 when unknown.
func requestSize(req *server.Request) int {
	if !req.HeaderOnly {
		return len(req.Body)
	}
	if n, err := strconv.Atoi(req.Headers["content-length"]); err == nil && n >= 0 {
		return n
	}
	return -1
}

func (d *Director) decide(ctx context.Context, req *server.Request, sr *scheduling.Request) (*server.Decision, *exchange, error) {
	candidates := subset(d.opts.Pool.Candidates(), req.SubsetHint)
	if len(candidates) == 0 {
		// GIE's 500 is for a request that has no body at all; a request
		// whose body the wasm filter described is an ordinary request.
		if req.HeaderOnly && req.Parsed == nil && sr.IncomingModel == "" {
			return nil, nil, &inferr.Error{Code: inferr.Internal, Msg: "no endpoints available for a request without a body"}
		}
		return nil, nil, &inferr.Error{Code: inferr.ServiceUnavailable, Msg: "no candidate endpoints for the request", DroppedReason: eppwire.DroppedNoEndpoints}
	}
	if flowcontrol.Sheddable(sr.Priority) && d.opts.Admission == nil && d.opts.Saturation != nil && d.opts.Saturation.Saturated(candidates) {
		return nil, nil, &inferr.Error{Code: inferr.ResourceExhausted, Msg: "pool is saturated and the request is sheddable", DroppedReason: eppwire.DroppedSaturated}
	}

	// The exchange releases the state after the last response hook; a
	// request refused here releases it at once.
	cs := scheduling.AcquireCycleState()
	start := time.Now()
	res, err := d.opts.Scheduler.Schedule(ctx, cs, sr, candidates)
	d.metrics.SchedulerDuration(time.Since(start))
	d.schedulerAttempt(sr, res, err)
	if err != nil {
		cs.Release()
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// The stream ended while scheduling: whatever a plugin made of
		// that, it is a cancellation, not a refusal.
		return nil, nil, fmt.Errorf("scheduling: %w", ctx.Err())
	case errors.Is(err, scheduling.ErrNotAdmitted):
		// First: an admitter's own reason may wrap anything.
		return nil, nil, &inferr.Error{Code: inferr.ResourceExhausted, Msg: err.Error(), DroppedReason: eppwire.DroppedSaturated}
	case errors.Is(err, scheduling.ErrNoCandidates):
		return nil, nil, &inferr.Error{Code: inferr.ServiceUnavailable, Msg: "no candidate endpoints for the request", DroppedReason: eppwire.DroppedNoEndpoints}
	case errors.Is(err, scheduling.ErrAllFiltered):
		return nil, nil, &inferr.Error{Code: inferr.ResourceExhausted, Msg: "no endpoint passed the scheduling filters", DroppedReason: eppwire.DroppedSaturated}
	case err != nil:
		return nil, nil, inferr.New(inferr.Internal, "scheduling failed: %v", err)
	}
	targets := res.Primary().Targets
	// Charged before the PreRequest hooks: they may release the prefix
	// match's per-candidate state.
	prompt, uncached := uncachedTokens(cs, sr, targets[0])
	if eppwire.PrefersIfAvailable(req.Headers[eppwire.HeaderPrefer]) && uncached >= prompt {
		// llm-d's conditional decode (its coordinator's speculative first
		// try): only a decode server already holding part of the prompt
		// may take it; otherwise the coordinator runs the full pipeline.
		cs.Release()
		return nil, nil, &inferr.Error{Code: inferr.PreconditionFailed, Msg: "no decode worker has the requested KV cache"}
	}
	ex := &exchange{d: d, sched: sr, cs: cs, received: req.ReceivedAt}
	// The class rides on the charge, so that a fallback moves it and the
	// response's end releases it with the rest of the live load.
	shed := flowcontrol.Sheddable(sr.Priority)
	if p := res.Prefill; p != nil {
		// P/D: the prefill server computes the prompt (less what it
		// holds) until the decode server's first token; the decode server
		// only waits for the KV to arrive.
		// Past its predicted finish there (when a plugin predicts one) the
		// KV is on the wire and the server is free of it: the charge
		// carries that, so a decision reads both from one account.
		pp, pu := uncachedTokens(cs, sr, p)
		var computed time.Time
		if f, ok := scheduling.Read(cs, scheduling.PrefillFinishKey); ok && f != nil {
			computed, _ = f.PrefillFinish(p)
		}
		ex.remote = p.ChargeComputedBy(shed, int64(pp-pu), int64(pu), int64(pp), int64(pp), computed)
		uncached = 0
	}
	res.Uncached = uncached
	ex.charge = targets[0].ChargeClass(shed, int64(prompt-uncached), int64(uncached), int64(prompt+sr.MaxTokens), sr.TokenEstimate())
	for _, h := range d.opts.Hooks.PreRequest {
		hs := time.Now()
		h.PreRequest(ctx, cs, sr, res)
		d.metrics.PluginDuration(scheduling.PointPreRequest, h.TypedName(), time.Since(hs))
	}

	for _, h := range d.opts.Hooks.Hold {
		if release, most := h.Hold(cs); release != nil {
			ex.hold, ex.holdMax = release, most
			break
		}
	}
	// The decision's last reader has run: what the plugins keep only for
	// it goes now, not with the response.
	cs.Decided()

	dec := &server.Decision{Endpoints: make([]string, len(targets)), Headers: res.Headers}
	for i, t := range targets {
		dec.Endpoints[i] = destination(t.Address(), res.DestinationPort)
	}
	ex.port = res.DestinationPort
	if sr.TargetModel != sr.IncomingModel {
		dec.TargetModel = sr.TargetModel
	}
	dec.EnginePriority = d.enginePriority(sr)
	// The decision was the body's last reader: the exchange keeps sr for
	// the response hooks, and with the body it would keep the whole
	// request in memory until the response ends, past the server's body
	// budget.
	sr.Body = nil
	return dec, ex, nil
}

// enginePriority is the body "priority" a request is sent with under
// Options.EnginePriority: its objective's priority (higher is more
// important) negated into vLLM's order (lower first). A request at 0 whose
// body sets none is left as it is, which vLLM reads as 0 too.
func (d *Director) enginePriority(sr *scheduling.Request) *int {
	if !d.opts.EnginePriority || sr.Body == nil {
		return nil
	}
	if api := sr.Body.API; api != openai.Completions && api != openai.ChatCompletions {
		return nil
	}
	if sr.Priority == 0 && sr.Body.RawField("priority") == nil {
		return nil
	}
	p := -sr.Priority
	return &p
}

// schedulerAttempt counts a scheduling attempt with the primary endpoint
// it chose.
func (d *Director) schedulerAttempt(sr *scheduling.Request, res *scheduling.Result, err error) {
	if err != nil || res == nil || len(res.Primary().Targets) == 0 {
		d.metrics.SchedulerAttempt(metrics.AttemptFailure, sr.TargetModel, "", "", "")
		return
	}
	t := res.Primary().Targets[0]
	_, port, _ := net.SplitHostPort(t.Address())
	d.metrics.SchedulerAttempt(metrics.AttemptSuccess, sr.TargetModel, t.Name(), t.Label(namespaceLabel), port)
}

// destination is where a request for the endpoint at addr goes: addr, or
// its host on port when port is set.
func destination(addr string, port int) string {
	if port == 0 {
		return addr
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// namespaceLabel is the endpoint label that carries its pod's namespace
// when discovery knows it.
const namespaceLabel = "namespace"

// uncachedTokens is the prompt's length and the prefill work the chosen
// endpoint must do: the prompt less what the prefix producer says it holds,
// or the whole prompt when no prefix plugin ran.
func uncachedTokens(cs *scheduling.CycleState, sr *scheduling.Request, target *endpoints.Endpoint) (prompt, uncached int) {
	prompt, held := sr.PromptTokens, 0
	if m, ok := scheduling.Read(cs, prefixmatch.MatchKey); ok {
		prompt, held = m.Prompt(prompt), m.HeldTokensOf(target)
	}
	return prompt, prefixmatch.Uncached(prompt, held)
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
	switch {
	case req.ModelRewrite != "":
		sr.TargetModel = req.ModelRewrite
	case d.opts.Rewrites != nil && sr.IncomingModel != "":
		if target, _, ok := d.opts.Rewrites.RewriteModel(sr.IncomingModel); ok {
			sr.TargetModel = target
		}
	}
	sr.TTFTSLO = sloHeader(req.Headers, eppwire.HeaderSLOTTFT, eppwire.HeaderSLOTTFTDeprecated)
	sr.TPOTSLO = sloHeader(req.Headers, eppwire.HeaderSLOTPOT, eppwire.HeaderSLOTPOTDeprecated)
	if d.opts.Objectives != nil && req.Objective != "" {
		if p, ok := d.opts.Objectives.Priority(req.Objective); ok {
			sr.Priority = p
		}
	}
	return sr
}

// maxSLO bounds an SLO header: beyond a day it is no objective.
const maxSLO = 24 * time.Hour

// sloHeader reads an SLO from the current header name, else the deprecated
// one. A malformed or non-positive value sets no SLO: the request is served
// as one without.
func sloHeader(h map[string]string, name, deprecated string) time.Duration {
	v, ok := h[name]
	if !ok {
		v, ok = h[deprecated]
	}
	if !ok {
		return 0
	}
	ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || !(ms > 0) {
		return 0
	}
	// Compared as floats: a huge value would overflow the conversion.
	if ns := ms * float64(time.Millisecond); ns < float64(maxSLO) {
		return time.Duration(ns)
	}
	return maxSLO
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

// exchange is one routed request from its decision to the end of its
// response: its scheduling state, its share of the endpoint's live load and
// what the stream has shown. The server calls it on the stream's goroutine,
// one event at a time, so it needs no lock.
type exchange struct {
	d      *Director
	labels metrics.Labels
	sched  *scheduling.Request
	cs     *scheduling.CycleState
	charge endpoints.Charge
	// remote is a P/D request's prefill on another server, released at the
	// first token (zero otherwise).
	remote   endpoints.Charge
	received time.Time
	status   int
	chunks   int
	first    time.Time
	last     time.Time
	bytes    int
	// busy is the picker's time spent on the response's chunks.
	busy time.Duration
	// port is the scheduling result's DestinationPort: the request went
	// to its rank's host on that port.
	port     int
	released bool
	// flow is the request's flow-control item, nil without flow control;
	// revoked, made with it, is closed by the flow controller's goroutine
	// (at most once: it revokes an item once).
	flow    *flowcontrol.Item
	revoked chan struct{}
	// hold, when set, is closed when a Holder lets the request go; it is
	// held at most holdMax.
	hold    <-chan struct{}
	holdMax time.Duration
}

// Hold is the release a Holder keeps the request until (nil: none) and
// the longest it may wait, for Options.DriverHolds.
func (x *exchange) Hold() (<-chan struct{}, time.Duration) { return x.hold, x.holdMax }

// awaitHold keeps the request while a Holder holds it. A client that goes
// away meanwhile ends the exchange as a response that never started: its
// load and its place in the Holder's line are released.
func (x *exchange) awaitHold(ctx context.Context) error {
	if x.hold == nil {
		return nil
	}
	start := x.d.now()
	t := time.NewTimer(x.holdMax)
	defer t.Stop()
	select {
	case <-x.hold:
		x.d.metrics.Held(metrics.HoldReleased, x.d.now().Sub(start))
	case <-t.C:
		x.d.metrics.Held(metrics.HoldBound, x.d.now().Sub(start))
	case <-ctx.Done():
		x.d.metrics.Held(metrics.HoldCancelled, x.d.now().Sub(start))
		// As the server ends an exchange: its hooks' context is not
		// cancelled with the stream.
		x.ResponseDone(context.WithoutCancel(ctx), server.ResponseSummary{})
		return fmt.Errorf("held for the prompts ahead: %w", ctx.Err())
	}
	return nil
}

func (x *exchange) revoke() { close(x.revoked) }

// Revoked implements server.Revocable: nil without flow control, which
// revokes nothing.
func (x *exchange) Revoked() <-chan struct{} { return x.revoked }

var (
	_ server.Exchange             = (*exchange)(nil)
	_ server.ResponseHeaderSetter = (*exchange)(nil)
	_ server.ResponseAnnotator    = (*exchange)(nil)
)

// ResponseStarted implements server.Exchange. When the proxy served the
// request from a fallback, the load moves to the endpoint that has it.
func (x *exchange) ResponseStarted(_ context.Context, head server.ResponseHead) {
	x.status = head.Status
	x.moveTo(head.ServedEndpoint)
}

// ResponseHeaders implements server.ResponseHeaderSetter: the
// ResponseHeader hooks' headers.
func (x *exchange) ResponseHeaders(ctx context.Context, head server.ResponseHead) map[string]string {
	hooks := x.d.opts.Hooks.ResponseHeader
	if len(hooks) == 0 || x.cs == nil {
		return nil
	}
	rh := &scheduling.ResponseHead{Status: head.Status, Headers: head.Headers, Served: head.ServedEndpoint, Endpoint: x.charge.Endpoint()}
	for _, h := range hooks {
		start := time.Now()
		h.ResponseHeader(ctx, x.cs, x.sched, rh)
		x.d.metrics.PluginDuration(scheduling.PointResponseHeader, h.TypedName(), time.Since(start))
	}
	return rh.SetHeaders()
}

// ResponseMetadata implements server.ResponseAnnotator: the
// ResponseMetadata hooks' metadata.
func (x *exchange) ResponseMetadata(ctx context.Context, usage openai.Usage, found bool) map[string]map[string]any {
	hooks := x.d.opts.Hooks.ResponseMetadata
	if len(hooks) == 0 || x.cs == nil {
		return nil
	}
	var u *openai.Usage
	if found {
		u = &usage
	}
	md := scheduling.Metadata{}
	for _, h := range hooks {
		start := time.Now()
		h.ResponseMetadata(ctx, x.cs, x.sched, u, md)
		x.d.metrics.PluginDuration(scheduling.PointResponseMetadata, h.TypedName(), time.Since(start))
	}
	return md
}

// moveTo moves the load to the endpoint the proxy reports it served the
// request from (a fallback), when that tells which endpoint it was. A
// request sent to a DestinationPort (llm-d's data-parallel handler: the
// rank's pod on its primary port, the rank in x-data-parallel-host-port)
// is reported by that pod's primary port, which names no rank: on the
// primary's pod the sidecar forwarded it to the rank charged, and on
// another pod the sidecar knows no rank by the header's address (llm-d's
// answers 400). The load then stays where it is, rather than on whatever
// rank listens on the primary port.
func (x *exchange) moveTo(served string) {
	at := x.charge.Endpoint()
	if served == "" || at == nil || x.port != 0 || served == at.Address() {
		return
	}
	if e := x.d.opts.Pool.ByAddress(served); e != nil {
		x.charge.Move(e)
	}
}

// ResponseChunk implements server.Exchange: the first body chunk marks the
// first token, ending the request's prefill; later chunks of a stream
// measure inter-chunk latency. Every chunk of a stream is also a step end
// of the serving endpoint, which its step clock keeps.
func (x *exchange) ResponseChunk(ctx context.Context, chunk []byte) {
	if len(chunk) == 0 {
		return
	}
	now := x.d.now()
	defer func() { x.busy += x.d.now().Sub(now) }()
	x.bytes += len(chunk)
	x.chunks++
	if e := x.charge.Endpoint(); e != nil && x.sched.Stream {
		var itl time.Duration
		if x.chunks > 1 {
			itl = now.Sub(x.last)
		}
		e.ObserveStep(now, itl)
	}
	if x.chunks == 1 {
		x.first = now
		x.charge.FirstToken()
		x.remote.Release()
		ttft := now.Sub(x.received)
		x.d.metrics.TTFT(x.sched.IncomingModel, x.sched.TargetModel, ttft)
		res := &scheduling.Response{Endpoint: x.charge.Endpoint(), Status: x.status, TTFT: ttft}
		for _, h := range x.firstTokenHooks() {
			hs := time.Now()
			h.FirstToken(ctx, x.cs, x.sched, res)
			x.d.metrics.PluginDuration(scheduling.PointFirstToken, h.TypedName(), time.Since(hs))
		}
		// After the hooks, and after the prefill server's charge was
		// released above: the dispatch pass this wakes sees the load as
		// it is now.
		if adm := x.d.opts.Admission; adm != nil {
			adm.Notify()
		}
	} else if x.sched.Stream {
		x.d.metrics.ITL(x.labels, now.Sub(x.last))
	}
	x.last = now
}

// firstTokenHooks are the FirstToken hooks to run: none once the exchange
// has ended and its cycle state is released.
func (x *exchange) firstTokenHooks() []scheduling.FirstToken {
	if x.cs == nil {
		return nil
	}
	return x.d.opts.Hooks.FirstToken
}

// ResponseDone implements server.Exchange.
func (x *exchange) ResponseDone(ctx context.Context, sum server.ResponseSummary) {
	if x.released {
		return
	}
	x.released = true
	start := x.d.now()
	x.moveTo(sum.ServedEndpoint)
	served := x.charge.Endpoint()
	x.charge.Release()
	x.remote.Release()
	x.d.metrics.Running(x.labels, -1)
	// A model server's answer other than 200 is the request's error, as
	// llm-d counts it.
	if sum.Status != 0 && sum.Status != 200 {
		x.d.metrics.RequestError(x.labels, string(inferr.ModelServerError))
	}

	res := &scheduling.Response{Endpoint: served, Status: sum.Status, Usage: sum.Usage, Complete: sum.Complete}
	if x.chunks > 0 {
		res.TTFT = x.first.Sub(x.received)
	}
	if sum.Complete {
		x.d.metrics.ResponseComplete(x.labels, metrics.Response{
			Received: x.received, FirstChunk: x.first, Done: start, Streaming: sum.Streaming, Bytes: x.bytes,
			Usage: sum.Usage, UsageFound: sum.UsageFound, Processing: x.busy + x.d.now().Sub(start),
		})
	}
	if sum.Complete && sum.UsageFound {
		// Time per output token needs tokens spread over time: only a
		// streamed response shows when its tokens were produced.
		if n := sum.Usage.CompletionTokens; sum.Streaming && n > 1 && x.chunks > 0 {
			res.TPOT = x.last.Sub(x.first) / time.Duration(n-1)
		}
	}
	for _, h := range x.d.opts.Hooks.ResponseComplete {
		hs := time.Now()
		h.ResponseComplete(ctx, x.cs, x.sched, res)
		x.d.metrics.PluginDuration(scheduling.PointResponse, h.TypedName(), time.Since(hs))
	}
	// After the hooks, as at the first token: the dispatch pass that
	// Finished wakes sees the load every plugin has released.
	if adm := x.d.opts.Admission; adm != nil && x.flow != nil {
		adm.Finished(x.flow)
	}
	// The last hook has run: the plugins' per-request state goes back to
	// their pools for the next request.
	x.cs.Release()
	x.cs = nil
}
