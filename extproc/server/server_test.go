package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/openai"
)

const chatBody = `{"model":"llama","messages":[{"role":"user","content":"Tell me a story about a robot"}],"stream":true,"stream_options":{"include_usage":true}}`

func TestRouteBodyInManyFrames(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000", "10.0.0.2:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{})))

	e.Send(envoytest.WithMetadata(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/chat/completions",
		"x-request-id", "req-1", "x-gateway-destination-endpoint", "6.6.6.6:1",
		"x-gateway-inference-objective", "critical", "content-length", strconv.Itoa(len(chatBody))),
		eppwire.MetadataLB, "unrelated", structpb.NewStringValue("x")))
	body := []byte(chatBody)
	for i := 0; i < len(body); i += 7 {
		e.Send(envoytest.RequestBody(body[i:min(i+7, len(body))], i+7 >= len(body)))
	}

	hr := e.Recv()
	set := envoytest.SetHeaders(t, hr)
	if got := set[eppwire.HeaderDestination]; got != "10.0.0.1:8000,10.0.0.2:8000" {
		t.Errorf("destination = %q", got)
	}
	if !hr.GetRequestHeaders().GetResponse().GetClearRouteCache() {
		t.Error("clear_route_cache not set")
	}
	if _, ok := set["content-length"]; ok {
		t.Error("content-length set although the body is unchanged")
	}
	if _, ok := set[eppwire.HeaderRequestID]; ok {
		t.Error("x-request-id overwritten although the client sent one")
	}
	lb := hr.GetDynamicMetadata().GetFields()[eppwire.MetadataLB].GetStructValue()
	if got := lb.GetFields()[eppwire.HeaderDestination].GetStringValue(); got != "10.0.0.1:8000,10.0.0.2:8000" {
		t.Errorf("envoy.lb metadata = %q", got)
	}
	br := envoytest.StreamedChunk(t, e.Recv().GetRequestBody())
	if string(br.GetBody()) != chatBody || !br.GetEndOfStream() {
		t.Errorf("re-sent body %q eos=%v", br.GetBody(), br.GetEndOfStream())
	}

	req := d.request(t)
	if req.ID != "req-1" || req.Method != "POST" || req.API != openai.ChatCompletions || req.HeaderOnly ||
		req.Parsed == nil || req.Parsed.Model != "llama" || !req.Parsed.Stream || req.Objective != "critical" ||
		req.FairnessID != DefaultFairnessID || req.SubsetHint != nil || string(req.Body) != chatBody {
		t.Errorf("request = %+v", req)
	}
	if _, ok := req.Headers[eppwire.HeaderDestination]; ok {
		t.Error("client-sent destination header reached the director")
	}

	// A JSON response, with usage split across chunks.
	e.Send(envoytest.WithMetadata(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"),
		eppwire.MetadataLB, eppwire.MetadataServedKey, structpb.NewStringValue("10.0.0.2:8000")))
	if e.Recv().GetResponseHeaders() == nil {
		t.Fatal("want a response headers response")
	}
	resp := `{"id":"x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":22,"prompt_tokens_details":{"cached_tokens":4}}}`
	for i, part := range []string{resp[:40], resp[40:]} {
		e.Send(envoytest.ResponseBody([]byte(part), i == 1))
		sr := envoytest.StreamedChunk(t, e.Recv().GetResponseBody())
		if string(sr.GetBody()) != part || sr.GetEndOfStream() != (i == 1) {
			t.Errorf("chunk %d passed back as %q eos=%v", i, sr.GetBody(), sr.GetEndOfStream())
		}
	}
	res := d.waitDone(t)
	want := ResponseSummary{Status: 200, Usage: openai.Usage{PromptTokens: 11, CompletionTokens: 22, CachedTokens: 4},
		UsageFound: true, Complete: true, ServedEndpoint: "10.0.0.2:8000"}
	if res != want {
		t.Errorf("summary = %+v, want %+v", res, want)
	}
	if err := e.Stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Stream.Recv(); err != io.EOF {
		t.Errorf("stream end = %v, want EOF", err)
	}
	if len(d.done) != 1 {
		t.Errorf("ResponseDone called %d times", len(d.done))
	}
}

func TestHeaderOnly(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models"))
	set := envoytest.SetHeaders(t, e.Recv())
	if set[eppwire.HeaderDestination] != "10.0.0.1:8000" {
		t.Errorf("destination = %q", set[eppwire.HeaderDestination])
	}
	if set[eppwire.HeaderRequestID] == "" {
		t.Error("generated request id not sent upstream")
	}
	req := d.request(t)
	if !req.HeaderOnly || req.Body != nil || req.Parsed != nil || req.API != "" || req.ID != set[eppwire.HeaderRequestID] {
		t.Errorf("request = %+v", req)
	}
	e.Send(envoytest.ResponseHeaders(true, ":status", "204"))
	e.Recv()
	if res := d.waitDone(t); !res.Complete || res.Status != 204 {
		t.Errorf("summary = %+v", res)
	}
}

// With request body mode NONE (the fast path behind the wasm filter) the
// decision is made on headers even though a body follows upstream.
func TestFastPathBodyModeNone(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{MaxRequestBodyBytes: 10})))
	e.Send(envoytest.WithModes(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions", "content-length", "5000"),
		procmode.ProcessingMode_NONE, procmode.ProcessingMode_NONE))
	if envoytest.SetHeaders(t, e.Recv())[eppwire.HeaderDestination] != "10.0.0.1:8000" {
		t.Fatal("no decision on headers")
	}
	if req := d.request(t); !req.HeaderOnly || req.Body != nil {
		t.Errorf("request = %+v", req)
	}
	e.Send(envoytest.RequestTrailers())
	if e.Recv().GetRequestTrailers() == nil {
		t.Fatal("want a request trailers response")
	}
	e.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"))
	e.Recv()
	_ = e.Stream.CloseSend()
	if res := d.waitDone(t); !res.Complete || res.UsageFound {
		t.Errorf("summary = %+v", res)
	}
}

// Outside FULL_DUPLEX_STREAMED, Envoy keeps the response body and wants only
// an empty answer per chunk.
func TestResponseBodyModeStreamed(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.WithModes(envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models"),
		procmode.ProcessingMode_FULL_DUPLEX_STREAMED, procmode.ProcessingMode_STREAMED))
	envoytest.SetHeaders(t, e.Recv())
	e.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"))
	e.Recv()
	e.Send(envoytest.ResponseBody([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":2}}`), true))
	br := e.Recv().GetResponseBody()
	if br == nil || br.GetResponse().GetBodyMutation() != nil {
		t.Fatalf("want an empty body response, got %v", br)
	}
	if res := d.waitDone(t); !res.Complete || res.Usage.CompletionTokens != 2 {
		t.Errorf("summary = %+v", res)
	}
}

func TestBadRequests(t *testing.T) {
	tests := []struct {
		name, path, body string
	}{
		{"invalid json", "/v1/chat/completions", `{"model":`},
		{"missing model", "/v1/completions", `{"prompt":"x"}`},
		{"empty messages", "/v1/chat/completions", `{"model":"m","messages":[]}`},
		{"empty prompt", "/v1/completions", `{"model":"m","prompt":""}`},
		{"empty body", "/v1/completions", ``},
	}
	c := startServer(t, New(newTestDirector("10.0.0.1:8000"), Options{}))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := envoytest.Open(t, c)
			e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", tt.path))
			e.Send(envoytest.RequestBody([]byte(tt.body), true))
			envoytest.ImmediateError(t, e.Recv(), 400, inferr.BadRequest)
			if _, err := e.Stream.Recv(); err != io.EOF {
				t.Errorf("after the immediate response: %v, want EOF", err)
			}
		})
	}
}

// Paths that are not OpenAI APIs reach the director with the body but no
// parse.
func TestNonOpenAIPathWithBody(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/tokenize"))
	e.Send(envoytest.RequestBody([]byte("not json"), true))
	envoytest.SetHeaders(t, e.Recv())
	if string(envoytest.StreamedChunk(t, e.Recv().GetRequestBody()).GetBody()) != "not json" {
		t.Error("body not re-sent")
	}
	if req := d.request(t); req.Parsed != nil || string(req.Body) != "not json" {
		t.Errorf("request = %+v", req)
	}
}

func TestDirectorErrors(t *testing.T) {
	tests := []struct {
		name       string
		headerOnly bool
		err        error
		decision   *Decision
		status     int
		code       inferr.Code
		dropped    string
		// wantDone: a decision was returned, so its exchange must end.
		wantDone int
	}{
		{name: "saturated", err: &inferr.Error{Code: inferr.ResourceExhausted, Msg: "saturated", DroppedReason: "rejected-saturated"},
			status: 429, code: inferr.ResourceExhausted, dropped: "rejected-saturated"},
		{name: "header-only no endpoints", headerOnly: true, err: &inferr.Error{Code: inferr.Internal, Msg: "no endpoints"},
			status: 500, code: inferr.Internal},
		{name: "wrapped", err: errors.Join(errors.New("ctx"), inferr.New(inferr.ServiceUnavailable, "none")), status: 503, code: inferr.ServiceUnavailable},
		{name: "untyped", err: errors.New("boom"), status: 500, code: inferr.Internal},
		{name: "empty decision", decision: &Decision{}, status: 503, code: inferr.ServiceUnavailable, wantDone: 1},
		{name: "nil decision", status: 500, code: inferr.Internal, wantDone: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDirector()
			d.decide = func(*Request) (*Decision, error) { return tt.decision, tt.err }
			e := envoytest.Open(t, startServer(t, New(d, Options{})))
			e.Send(envoytest.RequestHeaders(tt.headerOnly, ":method", "POST", ":path", "/v1/completions"))
			if !tt.headerOnly {
				e.Send(envoytest.RequestBody([]byte(`{"model":"m","prompt":"p"}`), true))
			}
			ir := envoytest.ImmediateError(t, e.Recv(), tt.status, tt.code)
			got := ""
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				if h.GetHeader().GetKey() == eppwire.HeaderDroppedReason {
					got = string(h.GetHeader().GetRawValue())
				}
			}
			if got != tt.dropped {
				t.Errorf("dropped reason = %q, want %q", got, tt.dropped)
			}
			if len(d.done) != tt.wantDone {
				t.Errorf("ResponseDone called %d times, want %d", len(d.done), tt.wantDone)
			}
		})
	}
}

func TestModelRewrite(t *testing.T) {
	d := newTestDirector()
	d.decide = func(r *Request) (*Decision, error) {
		return &Decision{Endpoints: []string{"10.0.0.1:8000"}, TargetModel: r.ModelRewrite,
			Headers: map[string]string{"x-prefiller-host-port": "10.0.0.9:8000"}}, nil
	}
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/chat/completions",
		"x-gateway-model-name-rewrite", "llama-lora", "content-length", strconv.Itoa(len(chatBody))))
	e.Send(envoytest.RequestBody([]byte(chatBody), true))
	set := envoytest.SetHeaders(t, e.Recv())
	if set["x-prefiller-host-port"] != "10.0.0.9:8000" {
		t.Errorf("director header missing: %v", set)
	}
	sr := envoytest.StreamedChunk(t, e.Recv().GetRequestBody())
	var got map[string]any
	if err := json.Unmarshal(sr.GetBody(), &got); err != nil {
		t.Fatal(err)
	}
	if got["model"] != "llama-lora" || got["stream"] != true {
		t.Errorf("rewritten body %s", sr.GetBody())
	}
	if set["content-length"] != strconv.Itoa(len(sr.GetBody())) {
		t.Errorf("content-length = %q, body is %d bytes", set["content-length"], len(sr.GetBody()))
	}
}

func TestLargeBodyResentInChunks(t *testing.T) {
	prompt := strings.Repeat("abcdefghij", 20_000) // 200 KB
	body := []byte(`{"model":"m","prompt":"` + prompt + `"}`)
	for _, rewrite := range []bool{false, true} {
		t.Run("rewrite="+strconv.FormatBool(rewrite), func(t *testing.T) {
			d := newTestDirector()
			d.decide = func(*Request) (*Decision, error) {
				dec := &Decision{Endpoints: []string{"10.0.0.1:8000"}}
				if rewrite {
					dec.TargetModel = "m2"
				}
				return dec, nil
			}
			e := envoytest.Open(t, startServer(t, New(d, Options{})))
			e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
			for i := 0; i < len(body); i += 16 << 10 {
				e.Send(envoytest.RequestBody(body[i:min(i+16<<10, len(body))], i+16<<10 >= len(body)))
			}
			envoytest.SetHeaders(t, e.Recv())
			var got []byte
			for {
				sr := envoytest.StreamedChunk(t, e.Recv().GetRequestBody())
				if len(sr.GetBody()) > DefaultBodyChunkSize {
					t.Fatalf("chunk of %d bytes", len(sr.GetBody()))
				}
				got = append(got, sr.GetBody()...)
				if sr.GetEndOfStream() {
					break
				}
			}
			want := body
			if rewrite {
				want, _ = d.request(t).Parsed.WithModel("m2")
			}
			if !bytes.Equal(got, want) {
				t.Errorf("re-sent %d bytes, want %d", len(got), len(want))
			}
		})
	}
}

func TestBodyTooLarge(t *testing.T) {
	c := startServer(t, New(newTestDirector("10.0.0.1:8000"), Options{MaxRequestBodyBytes: 100}))
	t.Run("streamed", func(t *testing.T) {
		e := envoytest.Open(t, c)
		e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
		e.Send(envoytest.RequestBody(make([]byte, 60), false))
		e.Send(envoytest.RequestBody(make([]byte, 60), false))
		envoytest.ImmediateError(t, e.Recv(), 413, inferr.BadRequest)
	})
	t.Run("content-length", func(t *testing.T) {
		e := envoytest.Open(t, c)
		e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions", "content-length", "101"))
		envoytest.ImmediateError(t, e.Recv(), 413, inferr.BadRequest)
	})
}

func TestSSEPassthrough(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/chat/completions"))
	e.Send(envoytest.RequestBody([]byte(chatBody), true))
	e.Recv()
	e.Recv()
	e.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "text/event-stream; charset=utf-8"))
	e.Recv()
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"Once\"}}],\"usage\":null}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\" upon\"}}],\"usage\":null}\r\n\r\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n" +
		"data: [DONE]\n\n"
	var echoed []byte
	for i := 0; i < len(sse); i += 13 {
		part := sse[i:min(i+13, len(sse))]
		e.Send(envoytest.ResponseBody([]byte(part), false))
		sr := envoytest.StreamedChunk(t, e.Recv().GetResponseBody())
		if string(sr.GetBody()) != part || sr.GetEndOfStream() {
			t.Fatalf("chunk %q passed back as %q", part, sr.GetBody())
		}
		echoed = append(echoed, sr.GetBody()...)
	}
	e.Send(envoytest.ResponseTrailers())
	if e.Recv().GetResponseTrailers() == nil {
		t.Fatal("want a response trailers response")
	}
	if string(echoed) != sse {
		t.Error("SSE not passed through byte for byte")
	}
	res := d.waitDone(t)
	want := ResponseSummary{Status: 200, Usage: openai.Usage{PromptTokens: 9, CompletionTokens: 2, CachedTokens: 8},
		UsageFound: true, Streaming: true, Complete: true}
	if res != want {
		t.Errorf("summary = %+v, want %+v", res, want)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if string(bytes.Join(d.chunks, nil)) != sse {
		t.Error("director did not see every chunk")
	}
}

func TestRequestTrailersEndTheBody(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
	e.Send(envoytest.RequestBody([]byte(`{"model":"m",`), false))
	e.Send(envoytest.RequestBody([]byte(`"prompt":"p"}`), false))
	e.Send(envoytest.RequestTrailers())
	envoytest.SetHeaders(t, e.Recv())
	if sr := envoytest.StreamedChunk(t, e.Recv().GetRequestBody()); sr.GetEndOfStream() || string(sr.GetBody()) != `{"model":"m","prompt":"p"}` {
		t.Errorf("body %q eos=%v; trailers follow, so no end_of_stream", sr.GetBody(), sr.GetEndOfStream())
	}
	if e.Recv().GetRequestTrailers() == nil {
		t.Fatal("want a request trailers response")
	}
}

func TestClientAbortReportsOnce(t *testing.T) {
	for _, when := range []string{"before response", "mid response"} {
		t.Run(when, func(t *testing.T) {
			d := newTestDirector("10.0.0.1:8000")
			e := envoytest.Open(t, startServer(t, New(d, Options{})))
			e.Send(envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models"))
			e.Recv()
			if when == "mid response" {
				e.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "text/event-stream"))
				e.Recv()
				e.Send(envoytest.ResponseBody([]byte("data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n"), false))
				e.Recv()
			}
			e.Cancel()
			res := d.waitDone(t)
			if res.Complete {
				t.Errorf("aborted response reported complete: %+v", res)
			}
			d.mu.Lock()
			if d.doneCtxCancelled {
				t.Error("ResponseDone got a cancelled context")
			}
			d.mu.Unlock()
			if when == "mid response" && (!res.UsageFound || res.Usage.CompletionTokens != 1) {
				t.Errorf("partial usage lost: %+v", res)
			}
			select {
			case extra := <-d.doneCh:
				t.Errorf("ResponseDone called twice: %+v", extra)
			default:
			}
		})
	}
}

func TestSubsetHint(t *testing.T) {
	list := func(s ...string) *structpb.Value {
		vs := make([]*structpb.Value, len(s))
		for i, x := range s {
			vs[i] = structpb.NewStringValue(x)
		}
		return structpb.NewListValue(&structpb.ListValue{Values: vs})
	}
	tests := []struct {
		name string
		ns   string
		v    *structpb.Value
		want []string
	}{
		{name: "absent", want: nil},
		{name: "other namespace", ns: eppwire.MetadataLB, v: list("1.1.1.1"), want: nil},
		{name: "empty", ns: eppwire.MetadataSubsetHint, v: list(), want: []string{}},
		{name: "list", ns: eppwire.MetadataSubsetHint, v: list("10.0.0.1:8000", "10.0.0.2"), want: []string{"10.0.0.1:8000", "10.0.0.2"}},
		{name: "comma string", ns: eppwire.MetadataSubsetHint, v: structpb.NewStringValue("10.0.0.1, 10.0.0.2"), want: []string{"10.0.0.1", "10.0.0.2"}},
		{name: "wrong type", ns: eppwire.MetadataSubsetHint, v: structpb.NewNumberValue(1), want: []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDirector("10.0.0.1:8000")
			e := envoytest.Open(t, startServer(t, New(d, Options{})))
			m := envoytest.RequestHeaders(true, ":method", "GET", ":path", "/")
			if tt.v != nil {
				envoytest.WithMetadata(m, tt.ns, eppwire.MetadataSubsetKey, tt.v)
			}
			e.Send(m)
			e.Recv()
			got := d.request(t).SubsetHint
			if (got == nil) != (tt.want == nil) || strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("hint = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestHeaderValues(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	m := envoytest.RequestHeaders(true, ":method", "GET", ":path", "/x", "X-Raw", "raw", "x-gateway-inference-fairness-id", "tenant-a")
	hm := m.GetRequestHeaders().GetHeaders()
	hm.Headers = append(hm.Headers,
		&corev3.HeaderValue{Key: "x-plain", Value: "plain"},
		&corev3.HeaderValue{Key: "x-dup", RawValue: []byte("a")},
		&corev3.HeaderValue{Key: "x-dup", RawValue: []byte("b")})
	e.Send(m)
	e.Recv()
	req := d.request(t)
	for k, want := range map[string]string{"x-raw": "raw", "x-plain": "plain", "x-dup": "a,b"} {
		if got := req.Headers[k]; got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if req.FairnessID != "tenant-a" {
		t.Errorf("fairness id = %q", req.FairnessID)
	}
}

// llm-d's x-llm-d-* names are read, GIE's x-gateway-* names still are,
// and the llm-d name wins when a request sends both.
func TestLLMDHeaderNames(t *testing.T) {
	tests := []struct {
		name                         string
		kv                           []string
		fairness, objective, rewrite string
	}{
		{"llm-d names", []string{"x-llm-d-inference-fairness-id", "t1", "x-llm-d-inference-objective", "critical", "x-llm-d-model-name-rewrite", "m1"}, "t1", "critical", "m1"},
		{"GIE names", []string{"x-gateway-inference-fairness-id", "t2", "x-gateway-inference-objective", "batch", "x-gateway-model-name-rewrite", "m2"}, "t2", "batch", "m2"},
		{"both: llm-d wins", []string{
			"x-gateway-inference-fairness-id", "old", "x-llm-d-inference-fairness-id", "new",
			"x-gateway-inference-objective", "old-obj", "x-llm-d-inference-objective", "new-obj",
			"x-llm-d-model-name-rewrite", "new-m", "x-gateway-model-name-rewrite", "old-m"}, "new", "new-obj", "new-m"},
		{"empty llm-d value falls back", []string{"x-llm-d-inference-objective", "", "x-gateway-inference-objective", "batch"}, DefaultFairnessID, "batch", ""},
		{"none", nil, DefaultFairnessID, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDirector("10.0.0.1:8000")
			e := envoytest.Open(t, startServer(t, New(d, Options{})))
			e.Send(envoytest.RequestHeaders(true, append([]string{":method", "GET", ":path", "/x"}, tc.kv...)...))
			e.Recv()
			req := d.request(t)
			if req.FairnessID != tc.fairness || req.Objective != tc.objective || req.ModelRewrite != tc.rewrite {
				t.Fatalf("fairness %q objective %q rewrite %q; want %q %q %q", req.FairnessID, req.Objective, req.ModelRewrite, tc.fairness, tc.objective, tc.rewrite)
			}
		})
	}
}

func TestUnsupportedBodyMode(t *testing.T) {
	e := envoytest.Open(t, startServer(t, New(newTestDirector("10.0.0.1:8000"), Options{})))
	e.Send(envoytest.WithModes(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"),
		procmode.ProcessingMode_BUFFERED, procmode.ProcessingMode_NONE))
	if _, err := e.Stream.Recv(); status.Code(err) != codes.Unimplemented {
		t.Errorf("err = %v, want Unimplemented", err)
	}
}

// A stream that breaks the protocol ends with a gRPC error, never a hang.
func TestMalformedStreams(t *testing.T) {
	post := func() *extprocv3.ProcessingRequest {
		return envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions")
	}
	get := func() *extprocv3.ProcessingRequest {
		return envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models")
	}
	okBody := envoytest.RequestBody([]byte(`{"model":"m","prompt":"p"}`), true)
	tests := []struct {
		name    string
		msgs    []*extprocv3.ProcessingRequest
		replies int // responses expected before the error
		code    codes.Code
	}{
		{"body before headers", []*extprocv3.ProcessingRequest{envoytest.RequestBody([]byte("x"), true)}, 0, codes.FailedPrecondition},
		{"response before request", []*extprocv3.ProcessingRequest{envoytest.ResponseHeaders(true, ":status", "200")}, 0, codes.FailedPrecondition},
		{"response body before response headers", []*extprocv3.ProcessingRequest{get(), envoytest.ResponseBody([]byte("x"), true)}, 1, codes.FailedPrecondition},
		{"headers twice", []*extprocv3.ProcessingRequest{post(), post()}, 0, codes.FailedPrecondition},
		{"response during request body", []*extprocv3.ProcessingRequest{post(), envoytest.ResponseHeaders(true, ":status", "200")}, 0, codes.FailedPrecondition},
		{"body after header-only request", []*extprocv3.ProcessingRequest{get(), envoytest.RequestBody([]byte("x"), true)}, 1, codes.FailedPrecondition},
		{"trailers after end of stream", []*extprocv3.ProcessingRequest{post(), okBody, envoytest.RequestTrailers()}, 2, codes.FailedPrecondition},
		{"message after completion", []*extprocv3.ProcessingRequest{get(), envoytest.ResponseHeaders(true, ":status", "200"), envoytest.ResponseBody([]byte("x"), true)}, 2, codes.FailedPrecondition},
		{"response trailers before headers", []*extprocv3.ProcessingRequest{get(), envoytest.ResponseTrailers()}, 1, codes.FailedPrecondition},
		{"empty message", []*extprocv3.ProcessingRequest{{}}, 0, codes.InvalidArgument},
	}
	c := startServer(t, New(newTestDirector("10.0.0.1:8000"), Options{}))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := envoytest.Open(t, c)
			for _, m := range tt.msgs {
				if err := e.Stream.Send(m); err != nil {
					break // the server may already have ended the stream
				}
			}
			for range tt.replies {
				e.Recv()
			}
			_, err := e.Stream.Recv()
			if status.Code(err) != tt.code {
				t.Errorf("err = %v, want %v", err, tt.code)
			}
		})
	}
}

func TestObservabilityModeSendsNothing(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	m := envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models")
	m.ObservabilityMode = true
	e.Send(m)
	_ = e.Stream.CloseSend()
	if _, err := e.Stream.Recv(); err != io.EOF {
		t.Errorf("got %v, want EOF with no responses", err)
	}
	if res := d.waitDone(t); res.Complete {
		t.Errorf("summary = %+v", res)
	}
}

// The P/D headers name where the decode pod's sidecar sends the prompt: a
// client's copies never reach the director, and those the picker does not
// set are removed from the upstream request.
func TestPickerOnlyHeadersRemoved(t *testing.T) {
	d := newTestDirector()
	d.decide = func(*Request) (*Decision, error) {
		return &Decision{Endpoints: []string{"10.0.0.1:8000"}, Headers: map[string]string{eppwire.HeaderPrefiller: "10.0.0.9:8000"}}, nil
	}
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/chat/completions",
		eppwire.HeaderPrefiller, "6.6.6.6:1", eppwire.HeaderEncoders, "6.6.6.6:2", eppwire.HeaderKVCacheSource, "6.6.6.6:3",
		eppwire.HeaderPrefillerLLMD, "6.6.6.6:4", "content-length", strconv.Itoa(len(chatBody))))
	e.Send(envoytest.RequestBody([]byte(chatBody), true))
	hr := e.Recv()
	set := envoytest.SetHeaders(t, hr)
	if set[eppwire.HeaderPrefiller] != "10.0.0.9:8000" {
		t.Errorf("prefiller = %q", set[eppwire.HeaderPrefiller])
	}
	removed := hr.GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders()
	slices.Sort(removed)
	// The x-llm-d-… spellings too: llm-d's sidecar reads them when the
	// older name is absent.
	want := []string{eppwire.HeaderEncoders, eppwire.HeaderKVCacheSource, eppwire.HeaderEncodersLLMD,
		eppwire.HeaderKVCacheSourceLLMD, eppwire.HeaderPrefillerLLMD, eppwire.HeaderDataParallel}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, h := range eppwire.PickerOnlyHeaders() {
		if _, ok := d.request(t).Headers[h]; ok {
			t.Errorf("client-sent %s reached the director", h)
		}
	}
}
