package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/internal/bytebudget"
	"github.com/kvgate/kvgate/internal/openai"
)

const (
	fullDuplex = procmode.ProcessingMode_FULL_DUPLEX_STREAMED
	noBody     = procmode.ProcessingMode_NONE

	preallocBodyBytes = 1 << 20
)

// phase is where a stream is in the request/response exchange; each
// ProcessingRequest is legal in exactly one or two phases.
type phase uint8

const (
	awaitRequestHeaders phase = iota
	readingRequestBody
	awaitResponseHeaders
	readingResponseBody
	finished
)

// stream is the state of one ext_proc stream. It is owned by the goroutine
// running Process for that stream.
type stream struct {
	srv   *Server
	ps    extprocv3.ExternalProcessor_ProcessServer
	ctx   context.Context
	watch *watch

	reqMode, respMode procmode.ProcessingMode_BodySendMode
	observeOnly       bool // Envoy ignores responses; send none

	phase phase
	req   *Request
	// body is the request body's share of the server's byte budget.
	body       bytebudget.Holder
	generated  bool // req.ID was generated here
	reqEnded   bool // no more request body or trailers will come
	hadCLength bool

	// exchange is the routed request's response observer; nil until a
	// decision was made.
	exchange Exchange
	// revocation is the exchange's Revocable channel; nil when it has none.
	revocation <-chan struct{}
	reported   bool
	status     int
	streaming  bool
	usage      openai.UsageScanner
	served     string
}

// revoked reports whether the routed request was revoked.
func (st *stream) revoked() bool {
	select {
	case <-st.revocation:
		return true
	default:
		return false
	}
}

func (st *stream) requestID() string {
	if st.req == nil {
		return ""
	}
	return st.req.ID
}

// handle processes one message; end is true when the stream is over from
// the server's side (an immediate response was sent).
func (st *stream) handle(msg *extprocv3.ProcessingRequest) (end bool, err error) {
	if pc := msg.GetProtocolConfig(); pc != nil && st.phase == awaitRequestHeaders {
		// Envoy sends the modes once, on the first message; they cannot
		// change under a request already in flight.
		st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	st.observeOnly = msg.GetObservabilityMode()
	if served := servedEndpoint(msg.GetMetadataContext()); served != "" {
		st.served = served
	}
	switch r := msg.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.onRequestHeaders(msg, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.onRequestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.onResponseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return false, st.onResponseTrailers()
	default:
		return false, status.Error(codes.InvalidArgument, "ext_proc: message carries no request, response, body or trailers")
	}
}

func (st *stream) outOfOrder(what string) error {
	return status.Errorf(codes.FailedPrecondition, "ext_proc: %s not expected in phase %s", what, st.phase)
}

func (st *stream) onRequestHeaders(msg *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.phase != awaitRequestHeaders {
		return false, st.outOfOrder("request headers")
	}
	switch st.reqMode {
	case fullDuplex, noBody:
	default:
		return false, status.Errorf(codes.Unimplemented,
			"ext_proc: request body mode %s is not supported; use FULL_DUPLEX_STREAMED or NONE", st.reqMode)
	}
	hm, err := headerMap(h.GetHeaders(), st.srv.headers)
	if err != nil {
		return true, st.immediate(&inferr.Error{Code: inferr.BadRequest, Status: http.StatusRequestHeaderFieldsTooLarge, Msg: err.Error()})
	}
	st.req, st.generated = newRequest(hm, msg.GetMetadataContext())
	st.req.ReceivedAt = time.Now()
	cl, hasCL := st.req.Headers["content-length"]
	st.hadCLength = hasCL
	if h.GetEndOfStream() || st.reqMode == noBody {
		st.req.HeaderOnly = true
		st.reqEnded = h.GetEndOfStream()
		return st.decide(false)
	}
	st.phase = readingRequestBody
	if n, err := strconv.ParseInt(cl, 10, 64); hasCL && err == nil && n > 0 {
		// Refuse early what cannot fit rather than buffer up to the limit.
		if n > int64(st.srv.maxBody) {
			return true, st.immediate(tooLarge(st.srv.maxBody))
		}
		// Size the buffer for the announced body, but only up to what a
		// typical prompt needs: the claim costs the client nothing until
		// the bytes arrive.
		c := min(n, preallocBodyBytes)
		if err := st.body.Grow(c); err != nil {
			return true, st.immediate(overBudget(err))
		}
		st.req.Body = make([]byte, 0, c)
	}
	return false, nil
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.phase != readingRequestBody {
		return false, st.outOfOrder("request body")
	}
	chunk := b.GetBody()
	n := len(st.req.Body) + len(chunk)
	if n > st.srv.maxBody {
		return true, st.immediate(tooLarge(st.srv.maxBody))
	}
	var err error
	if st.req.Body, err = st.body.Append(st.req.Body, chunk, st.srv.maxBody); err != nil {
		return true, st.immediate(overBudget(err))
	}
	if !b.GetEndOfStream() {
		return false, nil
	}
	return st.finishRequest(true)
}

func (st *stream) onRequestTrailers() (bool, error) {
	if st.req == nil || st.reqEnded {
		return false, st.outOfOrder("request trailers")
	}
	if st.phase == readingRequestBody {
		// Trailers are how Envoy says a body without end_of_stream is
		// complete.
		if end, err := st.finishRequest(false); end || err != nil {
			return end, err
		}
	}
	st.reqEnded = true
	return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{},
	}})
}

// finishRequest parses the complete body and decides. bodyEOS says whether
// the body ended with end_of_stream (rather than with trailers).
func (st *stream) finishRequest(bodyEOS bool) (bool, error) {
	st.reqEnded = bodyEOS
	if st.req.Body == nil {
		st.req.Body = []byte{} // a body was announced, even if empty
	}
	parsed, err := st.parse()
	if err != nil {
		return true, st.immediate(&inferr.Error{Code: inferr.BadRequest, Msg: err.Error()})
	}
	if st.srv.parser != nil {
		st.req.API = ""
		if parsed != nil {
			st.req.API = parsed.API
		}
	}
	st.req.Parsed = parsed
	return st.decide(bodyEOS)
}

// parse is the body's routing view: the server's parser's, or the OpenAI
// API the path names.
func (st *stream) parse() (*openai.Request, error) {
	switch {
	case st.srv.parser != nil:
		return st.srv.parser.Parse(st.req.Path, st.req.Body)
	case st.req.API != "":
		return openai.Parse(st.req.API, st.req.Body)
	}
	return nil, nil
}

// decide asks the Director and answers Envoy with the decision: the headers
// response, then (unless header-only) the body.
func (st *stream) decide(bodyEOS bool) (bool, error) {
	d, ex, err := st.srv.director.HandleRequest(st.ctx, st.req)
	if ex != nil && (err != nil || d == nil) {
		// A director that charged the request but did not decide: end
		// its exchange, so nothing it holds leaks.
		ex.ResponseDone(context.WithoutCancel(st.ctx), ResponseSummary{})
		ex = nil
	}
	if err == nil {
		switch {
		case d == nil || ex == nil:
			err = inferr.New(inferr.Internal, "director returned no decision")
		case len(d.Endpoints) == 0:
			// The director charged the request: end its exchange.
			ex.ResponseDone(context.WithoutCancel(st.ctx), ResponseSummary{})
			err = inferr.New(inferr.ServiceUnavailable, "no endpoints available for the request")
		}
	}
	if err != nil {
		if ctxErr := st.ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
			return true, status.FromContextError(ctxErr).Err()
		}
		return true, st.immediate(inferr.As(err))
	}
	st.exchange = ex
	st.phase = awaitResponseHeaders
	if r, ok := ex.(Revocable); ok {
		if st.revocation = r.Revoked(); st.revocation != nil {
			st.watch.revocable <- st.revocation
		}
	}

	body := st.req.Body
	rewritten := false
	if p := st.req.Parsed; p != nil {
		var set []openai.Field
		if d.TargetModel != "" && d.TargetModel != p.Model {
			set = append(set, openai.Field{Key: "model", Value: d.TargetModel})
		}
		if d.EnginePriority != nil {
			set = append(set, openai.Field{Key: "priority", Value: *d.EnginePriority})
		}
		if len(set) > 0 {
			b, err := p.With(set...)
			if err != nil {
				return true, st.immediate(inferr.New(inferr.Internal, "rewriting the body: %v", err))
			}
			body, rewritten = b, true
		}
	}
	dest := strings.Join(d.Endpoints, ",")
	if err := st.send(decisionResponse(st.req, d, dest, st.generated, rewritten && st.hadCLength, len(body))); err != nil {
		return false, err
	}
	if st.srv.log.Enabled(st.ctx, slog.LevelDebug) {
		st.srv.log.LogAttrs(st.ctx, slog.LevelDebug, "request routed",
			slog.String("request_id", st.req.ID), slog.String("endpoints", dest),
			slog.Bool("body_rewritten", rewritten))
	}
	if st.req.HeaderOnly {
		return false, nil
	}
	err = st.sendBody(body, bodyEOS)
	// The body is Envoy's again: nothing after the decision reads it. The
	// parsed view goes with it, since it keeps the body (and copies of its
	// fields): a long response would otherwise hold the body outside the
	// budget whose share is returned here.
	st.req.Body, st.req.Parsed = nil, nil
	st.body.Done()
	return false, err
}

// sendBody re-sends the request body in chunks Envoy can take; the last
// carries end_of_stream when the body had it. An empty body still gets one
// (empty) chunk so that Envoy sees its end.
func (st *stream) sendBody(body []byte, eos bool) error {
	n := st.srv.chunk
	for off := 0; ; off += n {
		end := min(off+n, len(body))
		last := end == len(body)
		if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: streamedBody(body[off:end], last && eos),
		}}); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

func (st *stream) onResponseHeaders(h *extprocv3.HttpHeaders) error {
	if st.phase != awaitResponseHeaders {
		return st.outOfOrder("response headers")
	}
	headers, err := headerMap(h.GetHeaders(), st.srv.headers)
	if err != nil {
		return status.Errorf(codes.ResourceExhausted, "ext_proc: response %v", err)
	}
	st.status, _ = strconv.Atoi(headers[":status"])
	st.streaming = strings.HasPrefix(headers["content-type"], "text/event-stream")
	st.usage.Reset(st.streaming)
	st.phase = readingResponseBody
	head := ResponseHead{Status: st.status, Headers: headers, ServedEndpoint: st.served}
	common := &extprocv3.CommonResponse{}
	if hs, ok := st.exchange.(ResponseHeaderSetter); ok {
		if set := hs.ResponseHeaders(st.ctx, head); len(set) > 0 {
			common.HeaderMutation = &extprocv3.HeaderMutation{}
			for k, v := range set {
				common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, setHeader(k, v))
			}
		}
	}
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: common},
	}}
	if h.GetEndOfStream() {
		resp.DynamicMetadata = st.responseMetadata()
	}
	if err := st.send(resp); err != nil {
		return err
	}
	st.exchange.ResponseStarted(st.ctx, head)
	if h.GetEndOfStream() {
		st.report(true)
	}
	return nil
}

// responseMetadata is the dynamic metadata the exchange reports with the
// response's last message; nil for none.
func (st *stream) responseMetadata() *structpb.Struct {
	a, ok := st.exchange.(ResponseAnnotator)
	if !ok {
		return nil
	}
	u, found := st.usage.Usage()
	md := a.ResponseMetadata(st.ctx, u, found)
	if len(md) == 0 {
		return nil
	}
	out := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(md))}
	for ns, kv := range md {
		v, err := structpb.NewStruct(kv)
		if err != nil {
			st.srv.log.LogAttrs(st.ctx, slog.LevelWarn, "response metadata dropped", slog.String("namespace", ns), slog.Any("error", err))
			continue
		}
		out.Fields[ns] = structpb.NewStructValue(v)
	}
	return out
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	if st.phase != readingResponseBody {
		return st.outOfOrder("response body")
	}
	chunk, eos := b.GetBody(), b.GetEndOfStream()
	// Pass the chunk on first: the client is waiting for it, the
	// bookkeeping is not.
	var resp *extprocv3.BodyResponse
	if st.respMode == fullDuplex {
		resp = streamedBody(chunk, eos)
	} else {
		resp = &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}
	}
	pr := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}}
	if eos {
		// The last chunk may carry the usage the metadata reports.
		_, _ = st.usage.Write(chunk)
		_ = st.usage.Close()
		pr.DynamicMetadata = st.responseMetadata()
	}
	if err := st.send(pr); err != nil {
		return err
	}
	if !eos {
		_, _ = st.usage.Write(chunk)
	}
	st.exchange.ResponseChunk(st.ctx, chunk)
	if eos {
		st.report(true)
	}
	return nil
}

func (st *stream) onResponseTrailers() error {
	if st.phase != readingResponseBody {
		return st.outOfOrder("response trailers")
	}
	_ = st.usage.Close()
	if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{},
	}, DynamicMetadata: st.responseMetadata()}); err != nil {
		return err
	}
	st.report(true)
	return nil
}

// closed handles Envoy half-closing the stream. With response body mode
// NONE the response headers are the last thing Envoy sends, so a clean close
// after them means the response went through.
func (st *stream) closed() {
	if st.phase == readingResponseBody && st.respMode == noBody {
		st.report(true)
	}
}

// abort releases a decided request whose response was not seen to its end.
func (st *stream) abort() { st.report(false) }

// report calls ResponseDone once per decided request.
func (st *stream) report(complete bool) {
	if st.exchange == nil || st.reported {
		return
	}
	st.reported = true
	st.phase = finished
	_ = st.usage.Close()
	u, found := st.usage.Usage()
	st.exchange.ResponseDone(context.WithoutCancel(st.ctx), ResponseSummary{
		Status:         st.status,
		Usage:          u,
		UsageFound:     found,
		Streaming:      st.streaming,
		Complete:       complete,
		ServedEndpoint: st.served,
	})
}

// immediate answers the request with an error instead of routing it.
func (st *stream) immediate(e *inferr.Error) error {
	st.phase = finished
	if st.srv.log.Enabled(st.ctx, slog.LevelDebug) {
		st.srv.log.LogAttrs(st.ctx, slog.LevelDebug, "request rejected",
			slog.String("request_id", st.requestID()), slog.String("code", string(e.Code)),
			slog.String("message", e.Msg))
	}
	return st.send(errorResponse(e))
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if st.observeOnly {
		return nil
	}
	if err := st.ps.Send(r); err != nil {
		return fmt.Errorf("ext_proc send: %w", err)
	}
	return nil
}

// idleTimeout is how long the stream may stay silent in its phase: the
// request timeout while the request arrives, the response timeout once it is
// routed or finished, none while nothing is due (a response whose body
// bypasses the picker sends nothing until the stream closes).
func (st *stream) idleTimeout() time.Duration {
	switch {
	case st.phase == awaitRequestHeaders || st.phase == readingRequestBody:
		return st.srv.reqIdle
	case st.phase == readingResponseBody && st.respMode == noBody:
		return 0
	}
	// Routed, or finished and waiting for the close.
	return st.srv.respIdle
}

func overBudget(err error) *inferr.Error {
	return &inferr.Error{Code: inferr.ServiceUnavailable, Msg: "request body refused: " + err.Error()}
}

func tooLarge(limit int) *inferr.Error {
	return &inferr.Error{Code: inferr.BadRequest, Status: 413,
		Msg: fmt.Sprintf("request body exceeds %d bytes", limit)}
}

func (p phase) String() string {
	switch p {
	case awaitRequestHeaders:
		return "awaiting request headers"
	case readingRequestBody:
		return "reading request body"
	case awaitResponseHeaders:
		return "awaiting response headers"
	case readingResponseBody:
		return "reading response body"
	default:
		return "finished"
	}
}
