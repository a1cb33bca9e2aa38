package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/uuid"
	"github.com/tetratelabs/wazero"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // client-side health checking

	"github.com/kvgate/kvgate/gateway/wasmhost"
	"github.com/kvgate/kvgate/internal/bytebudget"
	"github.com/kvgate/kvgate/internal/defaults"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/hints"
)

// BodyMode is how a body is sent to the picker (Envoy's BodySendMode, the
// two kvgate uses).
type BodyMode int

const (
	// FullDuplexStreamed sends the body in chunks as it arrives and takes
	// the body to forward from the picker's streamed responses.
	FullDuplexStreamed BodyMode = iota
	// None keeps the body away from the picker.
	None
)

// ParseBodyMode reads a --*-body-mode flag value.
func ParseBodyMode(s string) (BodyMode, error) {
	switch s {
	case "full-duplex-streamed":
		return FullDuplexStreamed, nil
	case "none":
		return None, nil
	}
	return 0, fmt.Errorf("body mode %q: want full-duplex-streamed or none", s)
}

func (m BodyMode) proto() extprocfilterv3.ProcessingMode_BodySendMode {
	if m == None {
		return extprocfilterv3.ProcessingMode_NONE
	}
	return extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// Config configures a Gateway. Zero durations and sizes take the defaults
// noted.
type Config struct {
	// ExtProc is the picker's gRPC address (host:port).
	ExtProc string
	// Wasm is the filter module; nil runs no filter.
	Wasm       []byte
	WasmConfig []byte
	// WasmVMConfig is the filter's VM configuration (precise mode: the
	// tokenizer files).
	WasmVMConfig []byte
	// WasmVMs bounds the filter's VM pool (default 4).
	WasmVMs   int
	WasmCache wazero.CompilationCache
	// FailureModeAllow lets requests continue when the picker fails (to
	// Fallback while it has not chosen), as Envoy's failure_mode_allow:
	// not once a FULL_DUPLEX_STREAMED body has begun to reach it.
	FailureModeAllow bool
	RequestBodyMode  BodyMode
	ResponseBodyMode BodyMode
	// ExtProcTimeout bounds the wait for each picker message (default 10s).
	ExtProcTimeout time.Duration
	// UpstreamTimeout bounds a whole upstream exchange; 0 means none.
	UpstreamTimeout time.Duration
	// Fallback endpoints (ip:port) take fail-open traffic, in order.
	Fallback []string
	// MaxRequestBuffer bounds the body bytes held for the filter (default
	// 16 MiB).
	MaxRequestBuffer int
	// BodyBudget bounds the request-body bytes all requests hold at once
	// (the filter's buffer, body-based routing's): a body that cannot be
	// held is refused with 503. Default DefaultBodyBudgetBytes;
	// bytebudget.New(-1) is unlimited.
	BodyBudget *bytebudget.Budget
	// BodyIdleTimeout bounds the wait for the next bytes of a request body
	// (default 60s; negative: none); a stalled upload is answered 408.
	BodyIdleTimeout time.Duration
	// UpstreamIdleTimeout bounds the wait for the upstream's response
	// headers and, after them, for each body chunk (default 5m, Envoy's
	// stream idle timeout; negative: none).
	UpstreamIdleTimeout time.Duration
	// MaxRequestHeaders and MaxRequestHeaderBytes bound the client's
	// header list (count of values; names plus values), as Envoy's
	// max_headers_count and max_request_headers_kb: 431 above them.
	// Defaults 100 and 60 KiB, Envoy's.
	MaxRequestHeaders     int
	MaxRequestHeaderBytes int
	// BlockedPaths are request paths never forwarded (403): model
	// servers' admin endpoints. nil takes DefaultBlockedPaths; an empty,
	// non-nil list blocks nothing.
	BlockedPaths []string
	// TrustClientRewrite keeps client-sent model rewrite headers
	// (x-gateway-model-name-rewrite, x-llm-d-model-name-rewrite); by default
	// they are removed, since they choose which model serves the request.
	TrustClientRewrite bool
	// PickerReconnectMax bounds the back-off between attempts to reach an
	// unreachable picker (default 1s), so that traffic returns to the
	// picker within about that long after an outage.
	PickerReconnectMax time.Duration
	// BodyBasedRouting, when set, runs GIE's Body-Based Router step before
	// the filter and the picker (bbr.go), counting in these metrics.
	BodyBasedRouting *BBRMetrics
	Logger           *slog.Logger
}

// Defaults of Config.
const (
	DefaultBodyBudgetBytes       = 256 << 20
	DefaultBodyIdleTimeout       = 60 * time.Second
	DefaultUpstreamIdleTimeout   = 5 * time.Minute
	DefaultMaxRequestHeaders     = 100
	DefaultMaxRequestHeaderBytes = 60 << 10
	DefaultPickerReconnectMax    = time.Second
)

// DefaultBlockedPaths are vLLM's administrative endpoints: a client able to
// reach them could flush a server's prefix cache (and with it the picker's
// index), put it to sleep, load adapters or read its metrics.
var DefaultBlockedPaths = []string{
	"/metrics", "/reset_prefix_cache", "/reset_mm_cache", "/sleep", "/wake_up", "/is_sleeping",
	"/collective_rpc", "/start_profile", "/stop_profile", "/scale_elastic_ep", "/is_scaling_elastic_ep",
	"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/server_info",
}

// Gateway is the request pipeline; it is an http.Handler safe for
// concurrent use.
type Gateway struct {
	cfg       Config
	blocked   map[string]bool
	fallbacks atomic.Uint64 // fail-open rotation
	conn      *grpc.ClientConn
	client    extprocv3.ExternalProcessorClient
	filter    *wasmhost.Host
	bbr       *BBRMetrics
	transport *http.Transport
	log       *slog.Logger
}

// New builds a Gateway: starts the filter's first VM (so a bad module or
// plugin configuration fails here) and prepares the picker connection,
// which is dialed lazily.
func New(ctx context.Context, cfg Config) (*Gateway, error) {
	if cfg.ExtProcTimeout <= 0 {
		cfg.ExtProcTimeout = 10 * time.Second
	}
	if cfg.MaxRequestBuffer <= 0 {
		cfg.MaxRequestBuffer = 16 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BodyBudget == nil {
		cfg.BodyBudget = bytebudget.New(DefaultBodyBudgetBytes)
	}
	cfg.BodyIdleTimeout = defaults.Duration(cfg.BodyIdleTimeout, DefaultBodyIdleTimeout)
	cfg.UpstreamIdleTimeout = defaults.Duration(cfg.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout)
	cfg.PickerReconnectMax = defaults.Duration(cfg.PickerReconnectMax, DefaultPickerReconnectMax)
	if cfg.MaxRequestHeaders <= 0 {
		cfg.MaxRequestHeaders = DefaultMaxRequestHeaders
	}
	if cfg.MaxRequestHeaderBytes <= 0 {
		cfg.MaxRequestHeaderBytes = DefaultMaxRequestHeaderBytes
	}
	if cfg.BlockedPaths == nil {
		cfg.BlockedPaths = DefaultBlockedPaths
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, blocked: map[string]bool{}, bbr: cfg.BodyBasedRouting}
	for _, p := range cfg.BlockedPaths {
		g.blocked[cleanPath(p)] = true
	}
	dialer := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}
	g.transport = &http.Transport{
		Proxy: nil, // never an environment proxy: the picker chose the host
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &dialError{err: err}
			}
			return c, nil
		},
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	if cfg.Wasm != nil {
		h, err := wasmhost.New(ctx, wasmhost.Config{
			Module: cfg.Wasm, PluginConfig: cfg.WasmConfig, VMConfig: cfg.WasmVMConfig, MaxVMs: cfg.WasmVMs,
			CompilationCache: cfg.WasmCache, Logger: cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("gateway: wasm filter: %w", err)
		}
		g.filter = h
	}
	if cfg.ExtProc != "" {
		conn, err := grpc.NewClient(cfg.ExtProc, grpc.WithTransportCredentials(insecure.NewCredentials()),
			pickerConnectParams(cfg.PickerReconnectMax), grpc.WithDefaultServiceConfig(pickerServiceConfig))
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("gateway: ext_proc %s: %w", cfg.ExtProc, err)
		}
		g.conn = conn
		g.client = extprocv3.NewExternalProcessorClient(conn)
	}
	return g, nil
}

// Close releases the filter VMs, the picker connection and idle upstream
// connections.
func (g *Gateway) Close() {
	if g.filter != nil {
		_ = g.filter.Close(context.Background())
	}
	if g.conn != nil {
		_ = g.conn.Close()
	}
	g.transport.CloseIdleConnections()
}

// pickerConnectParams bound gRPC's reconnect back-off: its default grows
// to 120 s, so after a picker outage of a minute the gateway kept failing
// (or failing open) for tens of seconds more, with the picker back.
func pickerConnectParams(maxDelay time.Duration) grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{
			BaseDelay:  min(100*time.Millisecond, maxDelay),
			Multiplier: 1.6,
			Jitter:     0.2,
			MaxDelay:   maxDelay,
		},
		MinConnectTimeout: 2 * time.Second,
	})
}

// pickerServiceConfig turns on gRPC client-side health checking against
// the picker's health service on the ext_proc port: a picker that is not
// ready yet or is draining answers NOT_SERVING, and requests then fail
// fast (or fail open) instead of queueing on it. A server without the
// health service counts as healthy.
const pickerServiceConfig = `{"loadBalancingConfig":[{"round_robin":{}}],` +
	`"healthCheckConfig":{"serviceName":"envoy.service.ext_proc.v3.ExternalProcessor"}}`

type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// statusError is a failure with the status the client gets.
type statusError struct {
	status int
	msg    string
	err    error
	// close ends the connection after the answer: the client's request
	// was not read to its end.
	close bool
}

func (e *statusError) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}
func (e *statusError) Unwrap() error { return e.err }

// request is the state of one request as it moves through the pipeline;
// it belongs to the ServeHTTP goroutine.
type request struct {
	headers headerList
	body    io.Reader
	client  *idleReader // the client's body, read under the idle timeout
	hasBody bool
	held    bytebudget.Holder // the filter's buffered body
	// whole is the entire body once body-based routing has buffered it
	// (under held), so that the filter does not buffer it again.
	whole     []byte
	proc      *processor  // nil without a picker or after failing open
	sender    *bodySender // full duplex: the client's body on its way to the picker
	pump      *bodyPump   // full duplex: the picker's body on its way upstream
	endpoints []string
	rec       *accessRecord
}

// finish runs when ServeHTTP returns: nothing may read the client's body
// after that (net/http forbids it), so a body sender or pump still running
// is interrupted and waited for (the pump reads the client itself once it
// failed open), and the buffered body's budget returned. The picker's
// stream is closed by then, so the pump's wait for it ends.
func (req *request) finish() {
	if req.sender != nil {
		select {
		case <-req.sender.done:
		default:
			req.client.interrupt()
			<-req.sender.done
		}
	}
	if req.pump != nil {
		select {
		case <-req.pump.done:
		default:
			req.pump.stop()
			req.client.interrupt()
			<-req.pump.done
		}
	}
	req.held.Done()
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	client := newIdleReader(r.Body, http.NewResponseController(w), g.cfg.BodyIdleTimeout)
	in := &countingReader{r: client}
	rec := &accessRecord{start: time.Now(), method: r.Method, path: r.URL.RequestURI(), in: in}
	defer g.logAccess(r.Context(), rec)
	ctx := r.Context()

	if err := g.checkRequest(r); err != nil {
		rec.outcome = "refused"
		g.fail(w, rec, err)
		return
	}
	req := &request{
		headers: requestHeaderList(r, g.filter == nil, !g.cfg.TrustClientRewrite),
		body:    in,
		client:  client,
		hasBody: r.ContentLength != 0,
		held:    g.cfg.BodyBudget.Hold(),
		rec:     rec,
	}
	defer req.finish()
	rid, ok := req.headers.get(eppwire.HeaderRequestID)
	if !ok {
		rid = uuid.NewString()
		req.headers = append(req.headers, [2]string{eppwire.HeaderRequestID, rid})
	}
	rec.requestID = rid

	if g.bbr != nil {
		if err := g.routeByBody(ctx, req); err != nil {
			g.fail(w, rec, err)
			return
		}
	}
	if g.filter != nil {
		local, err := g.runFilter(ctx, req)
		if err != nil {
			g.fail(w, rec, err)
			return
		}
		if local != nil {
			rec.outcome = "filter_response"
			writeLocal(w, rec, local.Status, local.Headers, local.Body)
			return
		}
	}
	if g.client != nil {
		imm, err := g.requestPhase(ctx, req)
		if err != nil {
			g.fail(w, rec, err)
			return
		}
		if imm != nil {
			rec.outcome = "immediate_response"
			g.writeImmediate(w, rec, imm)
			return
		}
	} else {
		req.endpoints = g.fallbackOrder()
		rec.outcome = "no_picker"
	}
	rec.decided = time.Since(rec.start)
	if req.proc != nil {
		defer req.proc.close()
	}
	g.proxy(ctx, w, req)
}

// checkRequest applies the limits that hold before anything is read: the
// header list's size (431) and the blocked admin paths (403).
func (g *Gateway) checkRequest(r *http.Request) error {
	n, size := 0, len(r.Host)
	for name, values := range r.Header {
		n += len(values)
		for _, v := range values {
			size += len(name) + len(v)
		}
	}
	if n > g.cfg.MaxRequestHeaders || size > g.cfg.MaxRequestHeaderBytes {
		return &statusError{status: http.StatusRequestHeaderFieldsTooLarge,
			msg: fmt.Sprintf("request headers too large: %d headers, %d bytes (at most %d, %d bytes)",
				n, size, g.cfg.MaxRequestHeaders, g.cfg.MaxRequestHeaderBytes)}
	}
	if g.blocked[cleanPath(r.URL.RequestURI())] {
		return &statusError{status: http.StatusForbidden, msg: "path not exposed through the gateway"}
	}
	return nil
}

// cleanPath is the form paths are compared in: the path as forwarded
// (the request target, which may start with "//"), without its query,
// decoded as the model server's router decodes it, without dot segments,
// repeated or trailing slashes.
func cleanPath(target string) string {
	p, _, _ := strings.Cut(target, "?")
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	return strings.TrimSuffix(path.Clean("/"+p), "/")
}

// fallbackOrder is the fallback list, starting at the next endpoint in
// turn: fail-open traffic spreads over all of them (each request still
// tries the rest, in order, when its first cannot be reached).
func (g *Gateway) fallbackOrder() []string {
	fb := g.cfg.Fallback
	if len(fb) < 2 {
		return fb
	}
	start := int(g.fallbacks.Add(1) % uint64(len(fb)))
	out := make([]string, 0, len(fb))
	return append(append(out, fb[start:]...), fb[:start]...)
}

// runFilter passes the request through the wasm filter, buffering the body
// while the filter pauses. On return req.headers are the filter's and
// req.body yields the whole body again.
//
// The body is read before a filter VM is taken: VMs are few (one per
// worker), and a client uploading slowly must not hold one while it does.
func (g *Gateway) runFilter(ctx context.Context, req *request) (*wasmhost.LocalResponse, error) {
	buffered, eof := req.whole, !req.hasBody || req.whole != nil
	if !eof {
		var err error
		if buffered, eof, err = bytebudget.ReadUpTo(req.body, g.cfg.MaxRequestBuffer+1, &req.held); err != nil {
			return nil, bodyError(err)
		}
	}
	// The body goes on whole whatever becomes of the filter: it may fail
	// on any call below, and the request then passes untagged.
	switch {
	case eof:
		req.body = bytes.NewReader(buffered)
	case len(buffered) > 0:
		req.body = io.MultiReader(bytes.NewReader(buffered), req.body)
	}
	vm, err := g.filter.Acquire(ctx)
	if err != nil {
		return nil, &statusError{status: http.StatusServiceUnavailable, msg: "wasm filter unavailable", err: err}
	}
	defer g.filter.Release(vm)
	// Forged hints must not survive a filter failure: the filter strips
	// them itself, so the gateway does it only when the filter did not run.
	withoutHints := stripHints(req.headers)
	s, err := vm.NewStream(ctx, req.headers)
	if err != nil {
		g.log.WarnContext(ctx, "wasm filter failed, request passes untagged", "err", err)
		req.headers = withoutHints
		return nil, nil
	}
	act, err := s.OnRequestHeaders(ctx, !req.hasBody)
	if err == nil && act == wasmhost.Pause && s.LocalResponse() == nil && req.hasBody {
		// The filter wants the body; all of it is here unless it is over
		// the buffer limit.
		if !eof {
			_ = s.Done(ctx)
			return nil, &statusError{status: http.StatusRequestEntityTooLarge, msg: "request body exceeds the buffer limit"}
		}
		act, err = s.OnRequestBody(ctx, buffered, true)
	}
	if err == nil {
		err = s.Done(ctx)
	}
	if err != nil {
		g.log.WarnContext(ctx, "wasm filter failed, request passes untagged", "err", err)
		req.headers = withoutHints
	} else {
		req.headers = headerList(s.Headers())
	}
	return s.LocalResponse(), nil
}

func stripHints(hs headerList) headerList {
	out := make(headerList, 0, len(hs))
	for _, kv := range hs {
		if !hints.IsHintHeader(kv[0]) {
			out = append(out, kv)
		}
	}
	return out
}

// requestPhase runs the request side of ext_proc. It returns the picker's
// immediate response if it sent one; otherwise req is ready for proxy.
func (g *Gateway) requestPhase(ctx context.Context, req *request) (*extprocv3.ImmediateResponse, error) {
	p, err := openProcessor(ctx, g.client, g.cfg.ExtProcTimeout, g.cfg.ExtProcTimeout)
	if err != nil {
		return nil, g.failOpen(ctx, req, err)
	}
	err = p.send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: req.headers.proto(), EndOfStream: !req.hasBody,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode: g.cfg.RequestBodyMode.proto(), ResponseBodyMode: g.cfg.ResponseBodyMode.proto(),
		},
	})
	if err != nil {
		p.close()
		return nil, g.failOpen(ctx, req, err)
	}
	var sender *bodySender
	if req.hasBody && g.cfg.RequestBodyMode == FullDuplexStreamed {
		sender = startBodySender(ctx, p, req.body)
		req.sender = sender
	}
	m, err := awaitPicker(ctx, p, sender)
	if err != nil && sender != nil {
		// A failed client body also cancels the request context (HTTP/1):
		// whichever the wait saw first, the body is the cause, and there
		// is no picker failure to fail open on. The context can end before
		// the sender has recorded the read error, so once it has ended the
		// sender is stopped and waited for.
		if ctx.Err() != nil {
			req.client.interrupt()
			<-sender.done
		}
		select {
		case <-sender.done:
			if sender.readErr != nil {
				p.close()
				return nil, bodyError(sender.readErr)
			}
		default:
		}
	}
	if err == nil {
		switch m.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse, *extprocv3.ProcessingResponse_RequestHeaders:
		default:
			err = fmt.Errorf("%w: unexpected %T to request headers", errProcessor, m.GetResponse())
		}
	}
	if err != nil {
		p.close()
		if err := g.failOpen(ctx, req, err); err != nil {
			return nil, err
		}
		if sender != nil {
			// After the log line: the rest waits for the client's body.
			req.body = sender.rest()
		}
		return nil, nil
	}
	if imm := m.GetImmediateResponse(); imm != nil {
		// No waiting for the rest of the upload: the sender ends on its
		// own once its sends fail or the server closes the body.
		p.close()
		return imm, nil
	}
	req.headers = req.headers.apply(m.GetRequestHeaders().GetResponse().GetHeaderMutation())
	req.endpoints = splitEndpoints(destination(req.headers, m.GetDynamicMetadata()))
	req.proc = p
	req.rec.outcome = "routed"
	if sender != nil {
		req.pump = startBodyPump(ctx, p, sender, func(err error) bool {
			if !g.goOnWithout(req, err) {
				return false
			}
			g.log.WarnContext(ctx, "endpoint picker failed, failing open", "err", err, "endpoint", req.endpoints)
			return true
		})
		req.body = req.pump.reader
	}
	return nil, nil
}

// goOnWithout reports whether the request goes on without the picker
// after the picker's stream ended with err, as Envoy's ext_proc filter
// rules: after a clean close (onGrpcClose), or a failure with
// FailureModeAllow (onGrpcError, onMessageTimeout), unless some of a
// FULL_DUPLEX_STREAMED request body has reached the picker, which owns it
// then: Envoy keeps no copy (Filter::failureModeAllow). For the response
// body see streamThroughPicker: the stand-in sends it to the picker only
// once the picker answered the response headers, and an end after that
// cuts the response in any case.
func (g *Gateway) goOnWithout(req *request, err error) bool {
	if !g.cfg.FailureModeAllow && !errors.Is(err, errPickerDone) {
		return false
	}
	return req.sender == nil || req.sender.failOpen()
}

// failOpen applies failure_mode_allow to a picker failure before the
// picker chose an upstream.
func (g *Gateway) failOpen(ctx context.Context, req *request, cause error) error {
	if !g.goOnWithout(req, cause) {
		msg := "endpoint picker failed"
		if req.sender != nil && g.cfg.FailureModeAllow {
			msg = "endpoint picker failed after the request body reached it"
		}
		return &statusError{status: statusFor(cause), msg: msg, err: cause}
	}
	g.log.WarnContext(ctx, "endpoint picker failed, failing open", "err", cause, "fallback", g.cfg.Fallback)
	req.rec.outcome = "fail_open"
	req.endpoints = g.fallbackOrder()
	return nil
}

func splitEndpoints(v string) []string {
	var eps []string
	for _, ep := range strings.Split(v, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			eps = append(eps, ep)
		}
	}
	return eps
}

// proxy forwards the request and streams the response back, through the
// picker's response phase when there is one.
func (g *Gateway) proxy(ctx context.Context, w http.ResponseWriter, req *request) {
	rec := req.rec
	if len(req.endpoints) == 0 {
		g.fail(w, rec, &statusError{status: http.StatusServiceUnavailable, msg: "no healthy upstream"})
		return
	}
	// The client's body may still be on its way upstream when the answer
	// starts: the transport's last read of it (the one that finds its end)
	// can come after an upstream has read all it needs and answered, and
	// an upstream may answer before it reads at all. Unless told the
	// handler is full duplex, net/http's HTTP/1 server reads the rest of
	// the body itself (when less than 256 KiB is left) before it writes
	// the header and then closes it: the header waited for the client's
	// rest, or the transport's next read failed and it closed the
	// upstream connection under the answer (TestHeaderBeforeTheBody,
	// TestEarlyHeaderKeepsTheAnswer). HTTP/2 is full duplex already.
	_ = http.NewResponseController(w).EnableFullDuplex()
	uctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if g.cfg.UpstreamTimeout > 0 {
		uctx, cancel = context.WithTimeout(uctx, g.cfg.UpstreamTimeout)
		defer cancel()
	}
	idle := newIdleWatch(g.cfg.UpstreamIdleTimeout, cancel)
	defer idle.stop()
	req.body = idle.reader(req.body)
	resp, ep, err := g.forwardWatched(ctx, uctx, cancel, req)
	// On a failure ep is the endpoint that failed: the access log names it.
	rec.endpoint = ep
	if err != nil && idle.fired.Load() {
		err = &statusError{status: http.StatusGatewayTimeout, msg: "upstream idle timeout", err: err}
	}
	if err != nil && req.pump != nil {
		// No upstream will read the rest of the request body. After a
		// success the transport closes the body when it is done with it
		// (see forward): an upstream may answer before the transport has
		// read the body's end, and stopping the pump then would break the
		// exchange.
		req.pump.stop()
	}
	if err != nil {
		g.fail(w, rec, err)
		return
	}
	resp.Body = idle.readCloser(resp.Body)
	defer resp.Body.Close()
	rec.upstream = time.Since(rec.start)
	if req.proc == nil {
		g.writeResponse(w, rec, responseHeaderList(resp), resp.Body, resp.Trailer)
		return
	}
	if req.pump != nil {
		// The picker's request-body messages come before any answer to
		// the response headers; the pump must have taken them all.
		if err := req.pump.wait(); err != nil {
			g.fail(w, rec, &statusError{status: statusFor(err), msg: "endpoint picker failed on the request body", err: err})
			return
		}
	}
	g.responsePhase(ctx, w, req, resp, ep)
}

// forwardWatched is forward while the picker's stream is watched, as
// Envoy watches it while the upstream works on the request: unless the
// request may go on without the picker (goOnWithout), a picker that ends
// its stream with an error (a revocation, a crash) fails the request at
// once, the upstream request cancelled (that is what makes a model server
// abort it), instead of when the response headers reach the picker. When
// it may, the request goes on and the response passes without the picker.
func (g *Gateway) forwardWatched(ctx, uctx context.Context, cancel context.CancelFunc, req *request) (*http.Response, string, error) {
	p := req.proc
	if p == nil || (g.cfg.FailureModeAllow && req.sender == nil) {
		// Nothing can take failing open away from this request.
		return g.forward(uctx, req)
	}
	var pickerErr error
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		p.watchFailure(ctx, stop, func(err error) {
			if !g.goOnWithout(req, err) {
				pickerErr = err
				cancel()
			}
		})
	}()
	resp, ep, err := g.forward(uctx, req)
	close(stop)
	<-watched
	if pickerErr == nil {
		return resp, ep, err
	}
	if err == nil {
		resp.Body.Close()
	}
	return nil, ep, &statusError{status: http.StatusInternalServerError, msg: "endpoint picker failed", err: fmt.Errorf("%w: %w", errProcessor, pickerErr)}
}

// forward tries the endpoints in order while connecting fails and the body
// is untouched (a retry after the body was read would lose it). It returns
// the endpoint that answered, or on failure the last one tried ("" if none
// was).
func (g *Gateway) forward(ctx context.Context, req *request) (*http.Response, string, error) {
	method, _ := req.headers.get(":method")
	path, _ := req.headers.get(":path")
	authority, _ := req.headers.get(":authority")
	body := &touchReader{r: req.body}
	var lastErr error
	tried := "" // the endpoint of the last failed attempt, for the access log
	for _, ep := range req.endpoints {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			lastErr = fmt.Errorf("endpoint %q: %w", ep, err)
			continue
		}
		var rb io.Reader = http.NoBody
		if req.hasBody {
			rb = body
		}
		u, err := http.NewRequestWithContext(ctx, method, "http://"+ep+path, rb)
		if err != nil {
			return nil, "", &statusError{status: http.StatusBadRequest, msg: "bad request line", err: err}
		}
		u.Header = make(http.Header, len(req.headers))
		req.headers.toHTTP(u.Header)
		u.Host = authority
		u.ContentLength = contentLength(req)
		var ab *attemptBody
		if req.hasBody {
			ab = &attemptBody{touchReader: body, pump: req.pump}
			u.Body = ab
		}
		tried = ep
		resp, err := g.transport.RoundTrip(u)
		if err == nil {
			if ab != nil {
				ab.responded()
			}
			return resp, ep, nil
		}
		if pickerFailed(err) {
			// The picker failed while streaming the body upstream.
			return nil, ep, &statusError{status: statusFor(err), msg: "endpoint picker failed on the request body", err: err}
		}
		lastErr = err
		var de *dialError
		if !errors.As(err, &de) || body.touched.Load() {
			break
		}
		g.log.WarnContext(ctx, "upstream connect failed, trying the next endpoint", "endpoint", ep, "err", err)
	}
	return nil, tried, &statusError{status: http.StatusServiceUnavailable, msg: "upstream connect error", err: lastErr}
}

// contentLength is the body length to announce upstream: the header's, or
// unknown (chunked) when there is none.
func contentLength(req *request) int64 {
	if !req.hasBody {
		return 0
	}
	if v, ok := req.headers.get("content-length"); ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			return n
		}
	}
	return -1
}

// responsePhase sends the upstream response through the picker: headers
// (with the served endpoint in metadata), body chunks, trailers.
func (g *Gateway) responsePhase(ctx context.Context, w http.ResponseWriter, req *request, resp *http.Response, ep string) {
	rec, p := req.rec, req.proc
	rh := responseHeaderList(resp)
	bodyless := resp.ContentLength == 0
	// A send fails only on a stream that has ended, and how it ended (a
	// clean close or a failure) is what the receiving side reports.
	_ = p.send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: rh.proto(), EndOfStream: bodyless,
		}},
		MetadataContext: &corev3.Metadata{FilterMetadata: servedMetadata(ep)},
	})
	m, err := p.next(ctx)
	if err != nil {
		if !g.goOnWithout(req, err) {
			g.fail(w, rec, &statusError{status: statusFor(err), msg: "endpoint picker failed on the response", err: err})
			return
		}
		g.log.WarnContext(ctx, "endpoint picker failed on the response headers, the response passes without it", "err", err)
		g.writeResponse(w, rec, rh, resp.Body, resp.Trailer)
		return
	}
	if imm := m.GetImmediateResponse(); imm != nil {
		g.writeImmediate(w, rec, imm)
		return
	}
	rh = rh.apply(m.GetResponseHeaders().GetResponse().GetHeaderMutation())
	if bodyless || g.cfg.ResponseBodyMode == None {
		g.writeResponse(w, rec, rh, resp.Body, resp.Trailer)
		return
	}
	g.streamThroughPicker(ctx, w, rec, p, rh, resp)
}

func statusFor(err error) int {
	if errors.Is(err, errProcessorTimeout) {
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// attemptBody is the request body of one upstream attempt. The transport
// closes it when it is done with the body, also when a dial fails. The
// pump may stop once the transport is done with the body of an attempt
// that read it or that got a response (in either order), never for one
// that failed untouched: that body goes on to the next endpoint.
type attemptBody struct {
	*touchReader
	pump *bodyPump

	mu        sync.Mutex
	closed    bool
	succeeded bool
}

func (a *attemptBody) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.touched.Load() || a.succeeded {
		a.stopPump()
	}
	return nil
}

// responded records that this attempt got a response.
func (a *attemptBody) responded() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.succeeded = true
	if a.closed {
		a.stopPump()
	}
}

func (a *attemptBody) stopPump() {
	if a.pump != nil {
		a.pump.stop()
	}
}

// bodyError is the client's answer to a failure reading its body.
func bodyError(err error) error {
	switch {
	case errors.Is(err, bytebudget.ErrExhausted):
		return &statusError{status: http.StatusServiceUnavailable, msg: "request body refused: gateway memory budget exhausted", err: err}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &statusError{status: http.StatusRequestTimeout, msg: "request body idle timeout", err: err, close: true}
	}
	return &statusError{status: http.StatusBadRequest, msg: "reading request body", err: err}
}

// awaitPicker waits for the picker's next message while the request body
// may still be on its way to it: the answer to the request headers, and
// the streamed body after them. A picker in full-duplex mode answers on
// the body it has, so the message timeout runs only once the body is sent;
// while it is being sent, a send blocked for longer than the timeout (the
// picker stopped reading) counts as the picker timing out, and a slow
// client does not.
func awaitPicker(ctx context.Context, p *processor, sender *bodySender) (*extprocv3.ProcessingResponse, error) {
	if sender == nil {
		return p.next(ctx)
	}
	tick := time.NewTicker(max(p.timeout/4, time.Millisecond))
	defer tick.Stop()
	for {
		m, err := p.wait(ctx, tick.C, sender.done)
		switch {
		case errors.Is(err, errStopped):
			if sender.readErr != nil {
				return nil, sender.readErr
			}
			return p.next(ctx)
		case errors.Is(err, errProcessorTimeout):
			if sender.stalledFor() > p.timeout {
				return nil, err
			}
			continue
		}
		return m, err
	}
}
