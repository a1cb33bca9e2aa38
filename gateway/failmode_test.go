package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/gateway"
)

// failCue is the point at which a cuePicker fails its stream.
type failCue int

const (
	cueRequestHeaders  failCue = iota // on the request headers
	cueDecidedHeaders                 // right after choosing on the headers, before any body
	cueRequestBody                    // once the whole request body arrived, unanswered
	cueStall                          // never answers (the message timeout fires)
	cueWhileUpstream                  // request answered, once the upstream has the request
	cueResponseHeaders                // on the response headers
	cueResponseBody                   // on the first response body chunk
)

// cuePicker is a minimal ext_proc processor that routes to endpoint,
// echoes bodies in FULL_DUPLEX_STREAMED responses and ends its stream with
// an error at its cue (cleanly, status OK, with clean). failed closes as
// it does.
type cuePicker struct {
	extprocv3.UnimplementedExternalProcessorServer
	endpoint    string
	cue         failCue
	clean       bool
	upstreamHas <-chan struct{} // closed by the upstream as the request reaches it
	failed      chan struct{}
	once        sync.Once
}

func (c *cuePicker) crash() error {
	c.once.Do(func() { close(c.failed) })
	if c.clean {
		return nil
	}
	return status.Error(codes.Internal, "picker crashed on cue")
}

func (c *cuePicker) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	msgs := make(chan *extprocv3.ProcessingRequest)
	go func() {
		defer close(msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	decide := func() error {
		return stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
					Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(c.endpoint)},
				}}},
			}},
		}})
	}
	streamed := func(b []byte, eos bool) *extprocv3.BodyResponse {
		return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: eos}},
		}}}
	}
	// armed is the upstream's signal once the request phase is answered.
	var armed <-chan struct{}
	arm := func() {
		if c.cue == cueWhileUpstream {
			armed = c.upstreamHas
		}
	}
	var body []byte
	for {
		var m *extprocv3.ProcessingRequest
		select {
		case m = <-msgs:
			if m == nil {
				return nil
			}
		case <-armed:
			return c.crash()
		}
		if c.cue == cueStall {
			continue
		}
		var err error
		switch r := m.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			switch {
			case c.cue == cueRequestHeaders:
				return c.crash()
			case c.cue == cueDecidedHeaders:
				if err := decide(); err != nil {
					return err
				}
				return c.crash()
			case r.RequestHeaders.GetEndOfStream() || m.GetProtocolConfig().GetRequestBodyMode() == extprocfilterv3.ProcessingMode_NONE:
				err = decide()
				arm()
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, r.RequestBody.GetBody()...)
			if !r.RequestBody.GetEndOfStream() {
				continue
			}
			if c.cue == cueRequestBody {
				return c.crash()
			}
			if err = decide(); err == nil {
				err = stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: streamed(body, true)}})
			}
			arm()
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			if c.cue == cueResponseHeaders {
				return c.crash()
			}
			err = stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
						Header: &corev3.HeaderValue{Key: "x-picker-saw-response", RawValue: []byte("true")},
					}}},
				}},
			}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			if c.cue == cueResponseBody {
				return c.crash()
			}
			err = stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
				ResponseBody: streamed(r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream()),
			}})
		}
		if err != nil {
			return err
		}
	}
}

// signalOn closes ch at the first log record with message msg.
type signalOn struct {
	msg  string
	ch   chan struct{}
	once sync.Once
}

func (s *signalOn) Enabled(context.Context, slog.Level) bool { return true }
func (s *signalOn) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *signalOn) WithGroup(string) slog.Handler            { return s }
func (s *signalOn) Handle(_ context.Context, r slog.Record) error {
	if r.Message == s.msg {
		s.once.Do(func() { close(s.ch) })
	}
	return nil
}

// failOutcome is what the client sees of a picker failure.
type failOutcome int

const (
	viaFallback  failOutcome = iota // failed open before a choice: the fallback answers
	viaPicked                       // went on without the picker: the chosen upstream answers, unprocessed
	failed500                       // answered 500 before the response began
	failed504                       // answered 504 (the message timeout)
	failedCancel                    // 500 while the upstream works, its request cancelled
	cut                             // the response, begun, breaks off
)

// TestPickerFailureMode follows Envoy's failure_mode_allow through each
// phase (ext_proc.cc Filter::onGrpcError, onGrpcClose, onMessageTimeout
// and failureModeAllow): without it every failure fails the request, 500
// (504 on the message timeout) or, once the response began, a cut. With
// it, or after the picker's clean close, the request goes on without the
// picker, unless some of a FULL_DUPLEX_STREAMED body reached the picker
// first: Envoy keeps no copy of such a body, so from then on it fails as
// without. hold makes the client send its body only once the gateway has
// given up on the picker, so that none of it has reached the picker then.
func TestPickerFailureMode(t *testing.T) {
	const (
		fds  = gateway.FullDuplexStreamed
		none = gateway.None
	)
	for _, tc := range []struct {
		name     string
		cue      failCue
		reqMode  gateway.BodyMode
		respMode gateway.BodyMode
		get      bool // no request body
		hold     bool
		allow    bool
		want     failOutcome
		clean    bool // the picker ends its stream cleanly (onGrpcClose: Envoy goes on without it)
	}{
		{"request headers, no body, allow", cueRequestHeaders, fds, none, true, false, true, viaFallback, false},
		{"request headers, no body", cueRequestHeaders, fds, none, true, false, false, failed500, false},
		{"request headers, body not yet sent, allow", cueRequestHeaders, fds, none, false, true, true, viaFallback, false},
		{"request headers, body mode none, allow", cueRequestHeaders, none, none, false, false, true, viaFallback, false},
		{"request body, allow", cueRequestBody, fds, none, false, false, true, failed500, false},
		{"request body", cueRequestBody, fds, none, false, false, false, failed500, false},
		{"message timeout, body mode none, allow", cueStall, none, none, false, false, true, viaFallback, false},
		{"message timeout on the body, allow", cueStall, fds, none, false, false, true, failed504, false},
		{"message timeout", cueStall, none, none, false, false, false, failed504, false},
		{"chosen on the headers, body not yet sent, allow", cueDecidedHeaders, fds, none, false, true, true, viaPicked, false},
		{"chosen on the headers", cueDecidedHeaders, fds, none, false, false, false, failed500, false},
		{"while the upstream works, body mode none, allow", cueWhileUpstream, none, none, false, false, true, viaPicked, false},
		{"while the upstream works, body streamed, allow", cueWhileUpstream, fds, none, false, false, true, failedCancel, false},
		{"while the upstream works", cueWhileUpstream, none, none, false, false, false, failedCancel, false},
		{"response headers, body mode none, allow", cueResponseHeaders, none, none, false, false, true, viaPicked, false},
		{"response headers, no body, allow", cueResponseHeaders, fds, none, true, false, true, viaPicked, false},
		{"response headers, body streamed, allow", cueResponseHeaders, fds, none, false, false, true, failed500, false},
		{"response headers", cueResponseHeaders, none, none, false, false, false, failed500, false},
		{"response body, allow", cueResponseBody, none, fds, false, false, true, cut, false},
		{"response body, request body streamed, allow", cueResponseBody, fds, fds, false, false, true, cut, false},
		{"response body", cueResponseBody, none, fds, false, false, false, cut, false},
		{name: "clean close on the request headers", cue: cueRequestHeaders, reqMode: none, clean: true, want: viaFallback},
		{name: "clean close while the upstream works", cue: cueWhileUpstream, reqMode: none, clean: true, want: viaPicked},
		{name: "clean close on the response headers", cue: cueResponseHeaders, reqMode: none, clean: true, want: viaPicked},
		{name: "clean close after the request body", cue: cueRequestBody, reqMode: fds, clean: true, want: failed500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstreamHas, cancelled := make(chan struct{}), make(chan struct{})
			picker := &cuePicker{cue: tc.cue, clean: tc.clean, upstreamHas: upstreamHas, failed: make(chan struct{})}
			picked := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.cue == cueWhileUpstream {
					close(upstreamHas)
					if tc.want == failedCancel {
						select {
						case <-r.Context().Done():
							close(cancelled)
						case <-time.After(10 * time.Second): // hang guard
						}
						return
					}
					select {
					case <-picker.failed:
					case <-time.After(10 * time.Second): // hang guard
						return
					}
				}
				// Several chunks, so that a streamed response is under way
				// when the picker fails on its first.
				_, _ = io.WriteString(w, strings.Repeat("answer ", 30_000))
			})
			picker.endpoint = picked.addr()
			fallback := newUpstream(t, nil)
			logged := &signalOn{msg: "endpoint picker failed, failing open", ch: make(chan struct{})}
			cfg := gateway.Config{
				ExtProc: serveProcessor(t, picker), FailureModeAllow: tc.allow, Fallback: []string{fallback.addr()},
				RequestBodyMode: tc.reqMode, ResponseBodyMode: tc.respMode, Logger: slog.New(logged),
			}
			if tc.cue == cueStall {
				cfg.ExtProcTimeout = 100 * time.Millisecond
			}
			url := startGateway(t, cfg)

			body := `{"model":"m","prompt":"` + strings.Repeat("0123456789", 20_000) + `"}` // several chunks
			var req *http.Request
			var err error
			switch {
			case tc.get:
				body = ""
				req, err = http.NewRequest(http.MethodGet, url+"/v1/models", nil)
			case tc.hold:
				pr, pw := io.Pipe()
				go func() {
					select {
					case <-logged.ch:
						_, _ = io.WriteString(pw, body)
						_ = pw.Close()
					case <-time.After(10 * time.Second): // hang guard
						_ = pw.CloseWithError(io.ErrUnexpectedEOF)
					}
				}()
				req, err = http.NewRequest(http.MethodPost, url+"/v1/completions", pr)
			default:
				req, err = http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
			}
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			var got []byte
			if err == nil {
				got, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if tc.want == cut {
				if err == nil {
					t.Fatalf("the response ended cleanly (%d, %d bytes), want it cut", resp.StatusCode, len(got))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantStatus := map[failOutcome]int{viaFallback: 200, viaPicked: 200, failed500: 500, failed504: 504, failedCancel: 500}[tc.want]
			if resp.StatusCode != wantStatus {
				t.Fatalf("status %d %q, want %d", resp.StatusCode, got[:min(len(got), 80)], wantStatus)
			}
			switch tc.want {
			case viaFallback:
				if saw := fallback.next(t); string(saw.body) != body {
					t.Fatalf("the fallback got %d body bytes, want %d", len(saw.body), len(body))
				}
			case viaPicked:
				if saw := picked.next(t); string(saw.body) != body {
					t.Fatalf("the chosen upstream got %d body bytes, want %d", len(saw.body), len(body))
				}
				if resp.Header.Get("x-picker-saw-response") != "" {
					t.Fatal("the response went through the failed picker")
				}
			case failedCancel:
				select {
				case <-cancelled:
				case <-time.After(10 * time.Second): // hang guard
					t.Fatal("the upstream's request was not cancelled")
				}
			}
		})
	}
}
