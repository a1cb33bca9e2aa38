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
// its response streams (flow control evicting a sheddable request): the
// stream is aborted at the next response chunk, which makes the proxy
// reset the request and the model server abort it.
type Revocable interface {
	Revoked() bool
}

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
// idle timeout: returning from the handler is the only way to end a gRPC
// stream whose Recv is blocked, and it makes that Recv return. The timeout
// runs only while the stream waits in Recv, and a message that arrives as
// it expires is not handled, so nothing is sent after the handler returned.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{srv: s, ps: ps, ctx: ps.Context(), body: s.budget.Hold()}
	st.reqMode, st.respMode = fullDuplex, fullDuplex
	w := &watch{expired: make(chan struct{})}
	w.timer = time.AfterFunc(time.Hour, w.expire)
	w.timer.Stop()
	done := make(chan error, 1)
	go func() { done <- st.run(w) }()
	select {
	case err := <-done:
		return err
	case <-w.expired:
		return status.Error(codes.DeadlineExceeded, "ext_proc: stream idle past its timeout")
	}
}

// watch is a stream's idle timer. state moves idle -> receiving -> idle
// around each Recv; the timer firing while receiving moves it to expired
// for good. deadline (unix ns) tells a callback of an earlier arming, run
// late, from the current one.
type watch struct {
	timer    *time.Timer
	state    atomic.Int32
	deadline atomic.Int64
	expired  chan struct{}
}

const (
	watchIdle int32 = iota
	watchReceiving
	watchExpired
)

func (w *watch) expire() {
	if time.Now().UnixNano() < w.deadline.Load() {
		return // an earlier arming's callback; the timer is armed again
	}
	if w.state.CompareAndSwap(watchReceiving, watchExpired) {
		close(w.expired)
	}
}

// run receives and handles the stream's messages until it ends; it owns
// st. After an expiry it only cleans up: the handler has returned.
func (st *stream) run(w *watch) error {
	s := st.srv
	defer st.body.Done()
	defer st.abort()
	for {
		timeout := st.idleTimeout()
		// Receiving before the timer is armed, or an early expiry is lost.
		w.deadline.Store(math.MaxInt64)
		w.state.Store(watchReceiving)
		if timeout > 0 {
			w.deadline.Store(time.Now().Add(timeout).UnixNano())
			w.timer.Reset(timeout)
		}
		msg, err := st.ps.Recv()
		w.timer.Stop()
		if !w.state.CompareAndSwap(watchReceiving, watchIdle) {
			s.log.LogAttrs(st.ctx, slog.LevelWarn, "ext_proc stream idle, ended",
				slog.String("request_id", st.requestID()), slog.Duration("timeout", timeout), slog.String("phase", st.phase.String()))
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
