package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/internal/bytebudget"
	"github.com/kvgate/kvgate/internal/defaults"
	"github.com/kvgate/kvgate/internal/openai"
)

// Defaults. The protocol's header and metadata names are in
// internal/eppwire, shared with the proxies that speak it.
const (
	DefaultFairnessID    = "default-flow"
	DefaultMaxBodyBytes  = 16 << 20
	DefaultBodyChunkSize = 62_000
	// DefaultMaxHeaders and DefaultMaxHeaderBytes are well above what
	// Envoy passes with its defaults (100 headers, 60 KiB) plus the
	// filter's hints, and far below what costs the picker noticeable CPU.
	DefaultMaxHeaders     = 1000
	DefaultMaxHeaderBytes = 256 << 10
	// DefaultBodyBudgetBytes bounds the request bodies all streams hold
	// at once: 16 maximal bodies.
	DefaultBodyBudgetBytes = 16 * DefaultMaxBodyBytes
	// DefaultRequestIdleTimeout bounds the wait for the next message while
	// the request is still arriving (headers, body): a stalled upload
	// holds a stream and its buffered body.
	DefaultRequestIdleTimeout = 30 * time.Second
	// DefaultResponseIdleTimeout bounds the wait for the response's next
	// message once the request is routed: a stream held open without a
	// response must not keep its endpoint's in-flight count up forever. A
	// model server's time to first byte under a deep queue is minutes at
	// worst.
	DefaultResponseIdleTimeout = 10 * time.Minute
)

// Director decides where each request goes. Implementations must be safe
// for concurrent use.
type Director interface {
	// HandleRequest is called once per request, after the headers and (unless
	// HeaderOnly) the whole body. It returns the decision and the Exchange
	// that owns the request's state from then on, or an error: an
	// *inferr.Error reaches the client as that error; any other error is
	// answered as Internal.
	HandleRequest(ctx context.Context, req *Request) (*Decision, Exchange, error)
}

// Exchange observes the response of one routed request. Its methods are
// called in order, on the stream's goroutine (so a slow call delays the
// response chunks behind it, and an Exchange needs no locking of its own):
// ResponseStarted, ResponseChunk for each body chunk, then ResponseDone
// exactly once. An aborted stream may skip straight to ResponseDone.
type Exchange interface {
	ResponseStarted(ctx context.Context, head ResponseHead)
	// ResponseChunk sees each response body chunk after it has been passed
	// on to the client; chunk is only valid during the call.
	ResponseChunk(ctx context.Context, chunk []byte)
	// ResponseDone ends the exchange: at the end of the response, or when
	// the stream is aborted or cancelled (Complete false, Usage partial or
	// zero), so that in-flight accounting is always released. Its context
	// is not cancelled with the stream.
	ResponseDone(ctx context.Context, res ResponseSummary)
}

// Revocable is implemented by exchanges whose request may be revoked while
// it is in flight (flow control evicting a sheddable request). Revoked is
// closed when the request is revoked; nil when it cannot be.
//
// The server then ends the stream with codes.Aborted, without waiting for
// the proxy's next message: a model server prefilling a long prompt sends
// nothing for seconds, and the request's capacity is what the revocation
// frees. Ending the stream with an error status is the one way the ext_proc
// protocol gives a processor to act when no message of the proxy's awaits
// an answer (an ImmediateResponse answers a message). Envoy under
// failure_mode_allow false (GIE's FailClose) answers it with a 500, or
// resets the downstream stream once the response has started, and either
// way resets the upstream request, which makes the model server abort it.
// Under failure_mode_allow true (FailOpen) Envoy carries on without the
// processor, past the picker's accounting, until a body chunk has passed
// in a direction it streams FULL_DUPLEX_STREAMED (Filter::failureModeAllow):
// from then on it fails the request as under FailClose. So a revocation
// works under FailOpen once the request body streamed to the picker, or
// on the headers-only fast path once the response body started.
//
// A revocation that arrives while the stream handles a message takes effect
// once that message is handled, before the stream waits for the next.
type Revocable interface {
	Revoked() <-chan struct{}
}

// errRevoked ends a revoked request's stream.
var errRevoked = status.Error(codes.Aborted, "request evicted by flow control")

// ResponseHeaderSetter is implemented by exchanges whose plugins set
// headers on the response to the client (GIE's ResponseHeader
// processors): called with the response's head before the headers are
// answered; the headers returned are set.
type ResponseHeaderSetter interface {
	ResponseHeaders(ctx context.Context, head ResponseHead) map[string]string
}

// ResponseAnnotator is implemented by exchanges whose plugins report the
// response to the proxy as dynamic metadata (GIE's
// request-attribute-reporter): called once, with the usage seen (found
// false: none), before the response's last message is answered, which
// carries the metadata returned (namespace → key → value; nil: none).
type ResponseAnnotator interface {
	ResponseMetadata(ctx context.Context, usage openai.Usage, found bool) map[string]map[string]any
}

// ResponseHead is what the response's headers tell.
type ResponseHead struct {
	Status  int
	Headers map[string]string
	// ServedEndpoint is the endpoint Envoy reports it used (envoy.lb /
	// x-gateway-destination-endpoint-served), when it has said so by now:
	// a fallback, when it differs from the decision's primary.
	ServedEndpoint string
}

// Request is one HTTP request as the picker sees it.
type Request struct {
	// ID is x-request-id, or a generated UUID when the client sent none
	// (then also set upstream, so that logs on both sides agree).
	ID     string
	Method string
	Path   string
	// Headers holds the request headers by lower-case name. A client-sent
	// x-gateway-destination-endpoint is removed: only the picker sets it.
	Headers map[string]string
	// Body is the complete request body; nil when HeaderOnly. It is valid
	// during HandleRequest: the server drops it (and its share of the body
	// budget) once it has sent the body back to the proxy.
	Body []byte
	// API is the API the body was parsed as: until then the OpenAI API
	// named by Path ("" for any other path), after the parser's.
	API openai.API
	// Parsed is the body parsed as API; nil when HeaderOnly or when the
	// body is routed without interpretation. It keeps the body, and is
	// dropped with it: a Director must not keep it past HandleRequest.
	Parsed *openai.Request
	// HeaderOnly is true when no body is seen: the request had none
	// (end_of_stream on its headers), or Envoy sends headers only (request
	// body mode NONE, the fast path) and the body's facts come as headers.
	HeaderOnly bool
	// SubsetHint is the proxy's list of allowed ip[:port]: nil when absent
	// (every endpoint is allowed), non-nil and empty when none is.
	SubsetHint []string
	// FairnessID is x-llm-d-inference-fairness-id (or GIE's
	// x-gateway-inference-fairness-id), default "default-flow".
	FairnessID string
	// Objective is x-llm-d-inference-objective (or GIE's
	// x-gateway-inference-objective): an InferenceObjective name.
	Objective string
	// ModelRewrite is x-llm-d-model-name-rewrite (or GIE's
	// x-gateway-model-name-rewrite).
	ModelRewrite string
	ReceivedAt   time.Time
}

// Decision is where a request goes.
type Decision struct {
	// Endpoints are ip:port, the primary first, then fallbacks in order.
	Endpoints []string
	// Headers are set on the upstream request (e.g. x-prefiller-host-port),
	// replacing any client value.
	Headers map[string]string
	// TargetModel, when set and different from the body's model, replaces
	// the model in the body sent upstream. It has no effect on a header-only
	// request: there the body, if any, bypasses the picker.
	TargetModel string
	// EnginePriority, when set, becomes the body's top-level "priority"
	// (vLLM's request priority under --scheduling-policy priority: lower
	// is scheduled first), replacing any client value. Like TargetModel it
	// needs the body.
	EnginePriority *int
}

// ResponseSummary is what the server learned about a response.
type ResponseSummary struct {
	// Status is the HTTP status; 0 when the response never started.
	Status int
	Usage  openai.Usage
	// UsageFound is false when the response carried no usage (yet).
	UsageFound bool
	// Streaming is true for a text/event-stream response.
	Streaming bool
	// Complete is true when the response was seen to its end.
	Complete bool
	// ServedEndpoint is the endpoint Envoy reports it used
	// (envoy.lb / x-gateway-destination-endpoint-served), when it does.
	ServedEndpoint string
}

// Options tunes a Server; zero values take the defaults.
type Options struct {
	// MaxRequestBodyBytes bounds the buffered request body; a larger request
	// is answered 413 (inference error BadRequest). Default 16 MiB.
	MaxRequestBodyBytes int
	// BodyChunkBytes is the largest StreamedBodyResponse chunk the body is
	// re-sent in. Default 62,000, under Envoy's 64 KiB recommendation.
	BodyChunkBytes int
	// MaxHeaders and MaxHeaderBytes bound one message's header list
	// (names plus values); a request over them is answered 431, a
	// response over them ends the stream. Defaults DefaultMaxHeaders,
	// DefaultMaxHeaderBytes.
	MaxHeaders     int
	MaxHeaderBytes int
	// BodyBudget bounds the request-body bytes buffered by all streams
	// together; a body that does not fit is answered 503. Default a budget
	// of DefaultBodyBudgetBytes; bytebudget.New(-1) is unlimited.
	BodyBudget *bytebudget.Budget
	// RequestIdleTimeout and ResponseIdleTimeout end a stream that sends
	// nothing for that long before, respectively after, its request was
	// routed (see the defaults). A negative value disables the timeout.
	RequestIdleTimeout  time.Duration
	ResponseIdleTimeout time.Duration
	// Parser parses request bodies; nil parses the OpenAI API :path
	// names and routes any other body uninterpreted.
	Parser BodyParser
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// BodyParser turns a request body into its routing view: nil for a body
// routed without interpretation, an error for one that must be refused
// (answered 400). A parsed request keeps body: the caller does not
// modify it.
type BodyParser interface {
	Parse(path string, body []byte) (*openai.Request, error)
}

// Server implements the ext_proc service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	director Director
	maxBody  int
	chunk    int
	headers  headerLimits
	budget   *bytebudget.Budget
	reqIdle  time.Duration
	respIdle time.Duration
	parser   BodyParser
	log      *slog.Logger
}

// New returns a Server that routes with director.
func New(director Director, opts Options) *Server {
	s := &Server{
		director: director,
		maxBody:  opts.MaxRequestBodyBytes,
		chunk:    opts.BodyChunkBytes,
		headers:  headerLimits{count: opts.MaxHeaders, bytes: opts.MaxHeaderBytes},
		budget:   opts.BodyBudget,
		reqIdle:  defaults.Duration(opts.RequestIdleTimeout, DefaultRequestIdleTimeout),
		respIdle: defaults.Duration(opts.ResponseIdleTimeout, DefaultResponseIdleTimeout),
		parser:   opts.Parser,
		log:      opts.Logger,
	}
	if s.headers.count <= 0 {
		s.headers.count = DefaultMaxHeaders
	}
	if s.headers.bytes <= 0 {
		s.headers.bytes = DefaultMaxHeaderBytes
	}
	if s.budget == nil {
		s.budget = bytebudget.New(DefaultBodyBudgetBytes)
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if s.chunk <= 0 {
		s.chunk = DefaultBodyChunkSize
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// BodyBudget is the budget request bodies are buffered against.
func (s *Server) BodyBudget() *bytebudget.Budget { return s.budget }

// Register adds the ext_proc service to g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
}

// Process serves one HTTP request's ext_proc stream.
//
// The stream runs on a goroutine of its own and the handler watches its
// idle timeout and its revocation: returning from the handler is the only
// way to end a gRPC stream whose Recv is blocked, and it makes that Recv
// return. Either ends the stream only while it waits in Recv, and a message
// that arrives as it does is not handled, so nothing is sent after the
// handler returned.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	w := &watch{ended: make(chan struct{}), revocable: make(chan (<-chan struct{}), 1)}
	st := &stream{srv: s, ps: ps, ctx: ps.Context(), body: s.budget.Hold(), watch: w}
	st.reqMode, st.respMode = fullDuplex, fullDuplex
	w.timer = time.AfterFunc(time.Hour, w.expire)
	w.timer.Stop()
	done := make(chan error, 1)
	go func() { done <- st.run() }()
	var revoked <-chan struct{}
	for {
		select {
		case err := <-done:
			return err
		case <-w.ended:
			return w.err
		case revoked = <-w.revocable:
		case <-revoked:
			revoked = nil
			// Refused while the stream handles a message: it looks
			// again before it waits for the next.
			w.end(errRevoked)
		}
	}
}

// watch ends a stream from outside its goroutine. state moves idle ->
// receiving -> idle around each Recv; the idle timer firing, or a
// revocation, while receiving moves it to ended for good, with err the
// handler's answer. deadline (unix ns) tells a timer callback of an earlier
// arming, run late, from the current one.
type watch struct {
	timer    *time.Timer
	state    atomic.Int32
	deadline atomic.Int64
	// ended is closed once err is set.
	ended chan struct{}
	err   error
	// revocable carries the exchange's revocation channel to the handler,
	// once the request is routed.
	revocable chan (<-chan struct{})
}

const (
	watchIdle int32 = iota
	watchReceiving
	watchEnded
)

var errIdle = status.Error(codes.DeadlineExceeded, "ext_proc: stream idle past its timeout")

func (w *watch) expire() {
	if time.Now().UnixNano() < w.deadline.Load() {
		return // an earlier arming's callback; the timer is armed again
	}
	w.end(errIdle)
}

// end ends the stream with err if it waits in Recv.
func (w *watch) end(err error) {
	if w.state.CompareAndSwap(watchReceiving, watchEnded) {
		w.err = err
		close(w.ended)
	}
}

// run receives and handles the stream's messages until it ends; it owns
// st. Once the watch has ended the stream it only cleans up: the handler
// has returned.
func (st *stream) run() error {
	s, w := st.srv, st.watch
	defer st.body.Done()
	defer st.abort()
	for {
		timeout := st.idleTimeout()
		// Receiving before the timer is armed, or an early expiry is lost;
		// before the revocation is looked at, or one the handler saw while
		// the last message was handled is lost.
		w.deadline.Store(math.MaxInt64)
		w.state.Store(watchReceiving)
		if st.revoked() && w.state.CompareAndSwap(watchReceiving, watchIdle) {
			return errRevoked
		}
		if timeout > 0 {
			w.deadline.Store(time.Now().Add(timeout).UnixNano())
			w.timer.Reset(timeout)
		}
		msg, err := st.ps.Recv()
		w.timer.Stop()
		if !w.state.CompareAndSwap(watchReceiving, watchIdle) {
			<-w.ended
			level := slog.LevelWarn
			if w.err == errRevoked {
				level = slog.LevelDebug // flow control's doing, counted there
			}
			s.log.LogAttrs(st.ctx, level, "ext_proc stream ended",
				slog.String("request_id", st.requestID()), slog.String("reason", status.Convert(w.err).Message()),
				slog.Duration("timeout", timeout), slog.String("phase", st.phase.String()))
			return nil
		}
		if errors.Is(err, io.EOF) {
			st.closed()
			return nil
		}
		if err != nil {
			if ctxErr := st.ctx.Err(); ctxErr != nil {
				return status.FromContextError(ctxErr).Err()
			}
			return err
		}
		end, err := st.handle(msg)
		if err != nil {
			if s.log.Enabled(st.ctx, slog.LevelWarn) && status.Code(err) != codes.Canceled {
				s.log.LogAttrs(st.ctx, slog.LevelWarn, "ext_proc stream failed",
					slog.String("request_id", st.requestID()), slog.Any("error", err))
			}
			return err
		}
		if end {
			return nil
		}
	}
}
