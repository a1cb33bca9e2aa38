package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/internal/openai"
)

// Defaults. The protocol's header and metadata names are in
// internal/eppwire, shared with the proxies that speak it.
const (
	DefaultFairnessID    = "default-flow"
	DefaultMaxBodyBytes  = 16 << 20
	DefaultBodyChunkSize = 62_000
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
	// Body is the complete request body; nil when HeaderOnly.
	Body []byte
	// API is the OpenAI API named by Path, "" for any other path.
	API openai.API
	// Parsed is the body parsed as API; nil when HeaderOnly or when API is "".
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
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server implements the ext_proc service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	director Director
	maxBody  int
	chunk    int
	log      *slog.Logger
}

// New returns a Server that routes with director.
func New(director Director, opts Options) *Server {
	s := &Server{
		director: director,
		maxBody:  opts.MaxRequestBodyBytes,
		chunk:    opts.BodyChunkBytes,
		log:      opts.Logger,
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

// Register adds the ext_proc service to g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
}

// Process serves one HTTP request's ext_proc stream.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	st := stream{srv: s, ps: ps, ctx: ps.Context()}
	st.reqMode, st.respMode = fullDuplex, fullDuplex
	defer st.abort()
	for {
		msg, err := ps.Recv()
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
