package gateway_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/gateway/wasmhost/wasmtest"
	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/testutil"
)

// upstream is a model server stand-in that records what reached it.
type upstream struct {
	*httptest.Server
	got chan upstreamSaw
}

type upstreamSaw struct {
	header http.Header
	body   []byte
}

func newUpstream(t testing.TB, handler http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{got: make(chan upstreamSaw, 64)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		select {
		case u.got <- upstreamSaw{header: r.Header.Clone(), body: b}:
		default:
		}
		if handler != nil {
			handler(w, r)
			return
		}
		w.Header().Set("content-type", "application/json")
		_, _ = io.WriteString(w, `{"served_by":"`+r.Host+`"}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) addr() string { return strings.TrimPrefix(u.URL, "http://") }

func (u *upstream) next(t testing.TB) upstreamSaw {
	t.Helper()
	select {
	case s := <-u.got:
		return s
	case <-time.After(10 * time.Second): // hang guard
		t.Fatal("upstream got no request")
		return upstreamSaw{}
	}
}

// startGateway runs a gateway on loopback and returns its base URL.
func startGateway(t testing.TB, cfg gateway.Config) string {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	g, err := gateway.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gateway.Serve(ctx, ln, g) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		g.Close()
	})
	return "http://" + ln.Addr().String()
}

func withFilter(t testing.TB, cfg gateway.Config, pluginConfig string) gateway.Config {
	cfg.Wasm = wasmtest.Filter(t)
	cfg.WasmCache = wasmtest.Cache(t)
	cfg.WasmConfig = []byte(pluginConfig)
	cfg.WasmVMs = 2
	return cfg
}

const chat = `{"model":"qwen","messages":[{"role":"user","content":"` +
	`Summarise the history of prefix caching in large language model serving systems."}]}`

func post(t testing.TB, client *http.Client, url, body string, headers map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestRoutesToPickedEndpoint covers the full path with the real filter, in
// both request body modes: hints reach the picker, the client's own
// destination header and forged hints do not, the body arrives upstream
// unchanged, and the served endpoint is reported back.
func TestRoutesToPickedEndpoint(t *testing.T) {
	for _, mode := range []gateway.BodyMode{gateway.FullDuplexStreamed, gateway.None} {
		t.Run(map[gateway.BodyMode]string{gateway.FullDuplexStreamed: "full-duplex", gateway.None: "none"}[mode], func(t *testing.T) {
			picked := newUpstream(t, nil)
			evil := newUpstream(t, nil)
			picker := &testPicker{endpoints: picked.addr()}
			url := startGateway(t, withFilter(t, gateway.Config{
				ExtProc: startPicker(t, picker), RequestBodyMode: mode,
			}, `{"blockSize":4}`))

			resp, body := post(t, http.DefaultClient, url+"/v1/chat/completions", chat, map[string]string{
				"x-gateway-destination-endpoint": evil.addr(),
				"x-kvgate-model":                 "forged",
			})
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, "served_by") {
				t.Fatalf("status %d body %q", resp.StatusCode, body)
			}
			if resp.Header.Get("x-picker-saw-response") != "true" {
				t.Fatalf("response header mutation not applied: %v", resp.Header)
			}
			up := picked.next(t)
			if string(up.body) != chat {
				t.Fatalf("upstream body %q", up.body)
			}
			select {
			case <-evil.got:
				t.Fatal("client-chosen upstream was used")
			default:
			}
			saw := picker.next(t)
			if _, ok := saw.headers["x-gateway-destination-endpoint"]; ok {
				t.Fatalf("picker saw the client's destination header: %v", saw.headers)
			}
			h, err := hints.Decode(func(k string) (string, bool) { v, ok := saw.headers[k]; return v, ok })
			if err != nil || h.Model != "qwen" || h.Prefix == nil || h.Prefix.Blocks == 0 {
				t.Fatalf("hints %+v: %v (headers %v)", h, err, saw.headers)
			}
			if saw.served != picked.addr() {
				t.Fatalf("served metadata %q, want %q", saw.served, picked.addr())
			}
			wantBody := ""
			if mode == gateway.FullDuplexStreamed {
				wantBody = chat
			}
			if string(saw.body) != wantBody {
				t.Fatalf("picker saw body %q, want %q", saw.body, wantBody)
			}
			if saw.headers["x-request-id"] == "" {
				t.Fatal("no x-request-id generated")
			}
		})
	}
}

// TestStripsHintsWithoutFilter: with no filter to vouch for them, client
// x-kvgate-* headers must not reach the picker.
func TestStripsHintsWithoutFilter(t *testing.T) {
	up := newUpstream(t, nil)
	picker := &testPicker{endpoints: up.addr()}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker)})
	post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{
		"x-kvgate-model": "forged", "x-kvgate-prefix": "1;m=a;b=16;s=0;n=0;k=1;h=",
	})
	for k := range picker.next(t).headers {
		if hints.IsHintHeader(k) {
			t.Fatalf("picker saw client header %s", k)
		}
	}
}

// lineWriter hands each log record to the test; the gateway logs after the
// response is written, so the test must wait for it.
type lineWriter chan []byte

func (w lineWriter) Write(p []byte) (int, error) {
	w <- append([]byte(nil), p...)
	return len(p), nil
}

func TestAccessLog(t *testing.T) {
	up := newUpstream(t, nil)
	lines := make(lineWriter, 16)
	url := startGateway(t, gateway.Config{
		ExtProc: startPicker(t, &testPicker{endpoints: up.addr()}),
		Logger:  slog.New(slog.NewJSONHandler(lines, nil)),
	})
	body := `{"model":"m","prompt":"hi"}`
	post(t, http.DefaultClient, url+"/v1/completions?x=1", body, nil)
	for {
		var line []byte
		select {
		case line = <-lines:
		case <-time.After(10 * time.Second): // hang guard
			t.Fatal("no access log")
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		if rec["msg"] != "access" {
			continue
		}
		want := map[string]any{
			"method": "POST", "path": "/v1/completions?x=1", "status": float64(200), "endpoint": up.addr(),
			"outcome": "routed", "bytes_in": float64(len(body)),
		}
		for k, v := range want {
			if rec[k] != v {
				t.Errorf("%s = %v, want %v (%s)", k, rec[k], v, line)
			}
		}
		for _, k := range []string{"decision_ms", "upstream_ms", "total_ms", "bytes_out", "request_id"} {
			if _, ok := rec[k]; !ok {
				t.Errorf("no %s in %s", k, line)
			}
		}
		return
	}
}

func TestFallbackOnConnectFailure(t *testing.T) {
	good := newUpstream(t, nil)
	picker := &testPicker{endpoints: testutil.RefusedAddr(t) + "," + good.addr()}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker)})
	resp, _ := post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	good.next(t)
	if saw := picker.next(t); saw.served != good.addr() {
		t.Fatalf("served %q, want %q", saw.served, good.addr())
	}
}

func TestAllEndpointsDown(t *testing.T) {
	picker := &testPicker{endpoints: testutil.RefusedAddr(t)}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker)})
	resp, _ := post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestImmediateResponse(t *testing.T) {
	up := newUpstream(t, nil)
	picker := &testPicker{endpoints: up.addr(), immediate: http.StatusTooManyRequests}
	for _, mode := range []gateway.BodyMode{gateway.FullDuplexStreamed, gateway.None} {
		url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker), RequestBodyMode: mode})
		resp, body := post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
		if resp.StatusCode != http.StatusTooManyRequests || body != "inference error: 429 - saturated" {
			t.Fatalf("mode %v: status %d body %q", mode, resp.StatusCode, body)
		}
	}
	select {
	case <-up.got:
		t.Fatal("upstream called despite an immediate response")
	default:
	}
}

// An immediate response can come while the gateway still streams the
// body to the picker, after the client's body was read to its end (with
// the filter, always). Stopping the body sender then must leave the client
// connection as it is: a read deadline set on it would cancel the context
// of the next request the client sends on the same keep-alive connection,
// which then failed with "endpoint picker failed" (found by `kvgate up
// --mixed`, where sheddable requests are refused under load).
func TestImmediateResponseKeepsTheConnectionUsable(t *testing.T) {
	up := newUpstream(t, nil)
	// The picker refuses on the headers (as kvgate's does with the
	// filter's hints) and the body is large, so that the gateway is still
	// sending it when the refusal comes.
	picker := &testPicker{endpoints: up.addr(), immediate: http.StatusTooManyRequests, decideOnHeaders: true}
	for _, tc := range []struct {
		name string
		cfg  gateway.Config
	}{
		{"no filter", gateway.Config{ExtProc: startPicker(t, picker), RequestBodyMode: gateway.FullDuplexStreamed}},
		{"filter", withFilter(t, gateway.Config{ExtProc: startPicker(t, picker), RequestBodyMode: gateway.FullDuplexStreamed}, "")},
		{"filter, no idle timeout", withFilter(t, gateway.Config{ExtProc: startPicker(t, picker), RequestBodyMode: gateway.FullDuplexStreamed, BodyIdleTimeout: -1}, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startGateway(t, tc.cfg)
			// One connection, so that every request follows a refused one on it.
			client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			body := `{"model":"m","prompt":"` + strings.Repeat("word ", 200_000) + `"}`
			for i := range 30 {
				resp, got := post(t, client, url+"/v1/completions", body, nil)
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("request %d: status %d %q, want 429", i, resp.StatusCode, got)
				}
			}
		})
	}
}

func TestPickerDown(t *testing.T) {
	fallback := newUpstream(t, nil)
	for _, tc := range []struct {
		name       string
		allow      bool
		wantStatus int
	}{
		{"fail-open", true, http.StatusOK},
		{"fail-closed", false, http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startGateway(t, gateway.Config{
				ExtProc: testutil.RefusedAddr(t), FailureModeAllow: tc.allow, Fallback: []string{fallback.addr()},
			})
			resp, _ := post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			if tc.allow {
				if got := fallback.next(t); string(got.body) != `{"model":"m","prompt":"hi"}` {
					t.Fatalf("fallback got body %q", got.body)
				}
			}
		})
	}
}

func TestPickerTimeout(t *testing.T) {
	for _, mode := range []gateway.BodyMode{gateway.FullDuplexStreamed, gateway.None} {
		url := startGateway(t, gateway.Config{
			ExtProc: startPicker(t, &testPicker{stall: true}), RequestBodyMode: mode, ExtProcTimeout: 50 * time.Millisecond,
		})
		resp, _ := post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("mode %v: status %d", mode, resp.StatusCode)
		}
	}
}

// TestSSEStreaming checks each event reaches the client before the
// upstream sends the next one: the upstream waits for the client to have
// read event i before writing event i+1, so buffering anywhere would hang
// (and trip the guard) rather than pass.
func TestSSEStreaming(t *testing.T) {
	const events = 4
	read := make(chan int, events)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := 0; i < events; i++ {
			_, _ = io.WriteString(w, "data: {\"i\":"+string(rune('0'+i))+"}\n\n")
			_ = rc.Flush()
			select {
			case <-read:
			case <-time.After(10 * time.Second): // hang guard
				return
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	picker := &testPicker{endpoints: up.addr()}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker)})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("content-type"); ct != "text/event-stream" {
		t.Fatalf("content-type %q", ct)
	}
	sse := testutil.NewSSEReader(resp.Body)
	got := 0
	var end error // why the stream stopped, if not at [DONE]
	for {
		data, err := sse.NextData()
		if err != nil {
			end = err
			break
		}
		if data == "[DONE]" {
			break
		}
		if want := "{\"i\":" + string(rune('0'+got)) + "}"; data != want {
			t.Fatalf("event %d = %q, want %q", got, data, want)
		}
		got++
		read <- got
	}
	if got != events {
		t.Fatalf("got %d events (%v)", got, end)
	}
	saw := picker.next(t)
	if !bytes.Contains(saw.respBody, []byte("[DONE]")) {
		t.Fatalf("picker did not see the response body: %q", saw.respBody)
	}
}

// TestBodilessRequest: headers with end of stream are the whole exchange
// with the picker; nothing waits for a body.
func TestBodilessRequest(t *testing.T) {
	up := newUpstream(t, nil)
	picker := &testPicker{endpoints: up.addr()}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker)})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if saw := picker.next(t); saw.headers[":method"] != "GET" || saw.served != up.addr() {
		t.Fatalf("picker saw %+v", saw)
	}
}

func TestH2C(t *testing.T) {
	up := newUpstream(t, nil)
	picker := &testPicker{endpoints: up.addr()}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker)})
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols, TLSClientConfig: &tls.Config{}}
	defer tr.CloseIdleConnections()
	resp, body := post(t, &http.Client{Transport: tr}, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK || !strings.Contains(body, "served_by") {
		t.Fatalf("proto %s status %d body %q", resp.Proto, resp.StatusCode, body)
	}
}

// TestFilterBufferLimit: a body the filter would buffer past the gateway's
// limit gets 413, as behind Envoy's buffer limit.
func TestFilterBufferLimit(t *testing.T) {
	up := newUpstream(t, nil)
	url := startGateway(t, withFilter(t, gateway.Config{
		ExtProc: startPicker(t, &testPicker{endpoints: up.addr()}), MaxRequestBuffer: 1024,
	}, `{"maxBodyBytes":1048576}`))
	big := `{"model":"m","prompt":"` + strings.Repeat("a", 4096) + `"}`
	resp, _ := post(t, http.DefaultClient, url+"/v1/completions", big, nil)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// TestFilterFailureKeepsTheBody: a filter that fails on a request (here it
// traps creating the request's context) lets it pass untagged with its
// whole body, which the gateway had already read for the filter.
func TestFilterFailureKeepsTheBody(t *testing.T) {
	up := newUpstream(t, nil)
	url := startGateway(t, gateway.Config{Wasm: trappingFilter(), Fallback: []string{up.addr()}})
	resp, body := post(t, http.DefaultClient, url+"/v1/chat/completions", chat, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if saw := up.next(t); string(saw.body) != chat {
		t.Fatalf("upstream got body %q, want the client's", saw.body)
	}
}

// trappingFilter is a minimal proxy-wasm module: its root context starts,
// and creating any request's context traps.
func trappingFilter() []byte {
	uleb := func(b []byte, v int) []byte {
		for ; v >= 0x80; v >>= 7 {
			b = append(b, byte(v)|0x80)
		}
		return append(b, byte(v))
	}
	section := func(mod []byte, id byte, items ...[]byte) []byte {
		content := uleb(nil, len(items))
		for _, it := range items {
			content = append(content, it...)
		}
		return append(uleb(append(mod, id), len(content)), content...)
	}
	const i32 = 0x7f
	types := [][]byte{
		{0x60, 2, i32, i32, 0},           // (ctx, parent) -> ()
		{0x60, 2, i32, i32, 1, i32},      // (ctx, size) -> bool
		{0x60, 3, i32, i32, i32, 1, i32}, // (ctx, n, end_of_stream) -> action
		{0x60, 1, i32, 0},                // (ctx) -> ()
		{0x60, 1, i32, 1, i32},           // (size) -> ptr
	}
	funcs := []struct {
		name string
		typ  byte
		body []byte
	}{
		// local.get 1 (the parent); if it is set: unreachable.
		{"proxy_on_context_create", 0, []byte{0x20, 1, 0x04, 0x40, 0x00, 0x0b}},
		{"proxy_on_vm_start", 1, []byte{0x41, 1}},
		{"proxy_on_configure", 1, []byte{0x41, 1}},
		{"proxy_on_request_headers", 2, []byte{0x41, 0}},
		{"proxy_on_request_body", 2, []byte{0x41, 0}},
		{"proxy_on_log", 3, nil},
		{"proxy_on_delete", 3, nil},
		{"proxy_on_memory_allocate", 4, []byte{0x41, 0}},
	}
	var fsec, exports, code [][]byte
	exports = append(exports, append(append([]byte{6}, "memory"...), 2, 0))
	for i, f := range funcs {
		fsec = append(fsec, []byte{f.typ})
		exports = append(exports, append(append(uleb(nil, len(f.name)), f.name...), 0, byte(i)))
		body := append(append([]byte{0}, f.body...), 0x0b) // no locals, end
		code = append(code, append(uleb(nil, len(body)), body...))
	}
	mod := []byte("\x00asm\x01\x00\x00\x00")
	mod = section(mod, 1, types...)
	mod = section(mod, 3, fsec...)
	mod = section(mod, 5, []byte{0, 1}) // one memory of one page
	mod = section(mod, 7, exports...)
	return section(mod, 10, code...)
}

func TestMainFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--request-body-mode", "buffered"},
		{"--fallback-endpoint", "not-an-endpoint"},
		{"--wasm", "/nonexistent/filter.wasm"},
		{"--wasm", "", "--metrics-addr", "127.0.0.1:notaport"},
		{"stray"},
	} {
		if err := gateway.Main(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("Main(%q) succeeded", args)
		}
	}
}

// An upstream that answers as soon as it has read the body's Content-Length
// bytes must not lose its response while the picker has yet to end the
// body stream (the transport's last read of the body is still waiting).
func TestUpstreamAnswersBeforeBodyStreamEnds(t *testing.T) {
	// A response larger than the socket buffers is still in flight when
	// the request body's stream ends.
	answer := strings.Repeat("x", 4<<20)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, answer)
	})
	picker := &testPicker{endpoints: up.addr(), lateEOS: 200 * time.Millisecond}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker), ResponseBodyMode: gateway.None})
	for range 3 {
		resp, body := post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
		if resp.StatusCode != http.StatusOK || body != answer {
			t.Fatalf("status %d, %d of %d body bytes", resp.StatusCode, len(body), len(answer))
		}
	}
}

// A streamed response whose upstream pauses longer than the picker's
// message timeout is not cut: no picker reply is pending during the pause.
// The timeout is a second: every picker reply the request does wait for
// (the headers, each chunk) must come within it, which a loaded machine's
// scheduling delays must not exceed.
func TestSlowStreamOutlivesMessageTimeout(t *testing.T) {
	const timeout = time.Second
	events := []string{"data: {\"n\":1}\n\n", "data: {\"n\":2}\n\n", "data: [DONE]\n\n"}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "text/event-stream")
		for i, ev := range events {
			if i > 0 {
				time.Sleep(timeout * 3 / 2)
			}
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	})
	picker := &testPicker{endpoints: up.addr()}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker), ExtProcTimeout: timeout})
	resp, body := post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	if resp.StatusCode != http.StatusOK || body != strings.Join(events, "") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
}

// TestSlowUploadAfterEarlyDecision: a picker that routes on the headers
// (kvgate's, given the filter's hints) still echoes the body, which it has
// only once the client has sent it. The per-message timeout is the picker's,
// not the client's: a client pausing longer than it mid-body, within the
// body idle timeout, must still be served, as it is when the picker decides
// on the whole body. Before, the goroutine taking the picker's body messages
// waited for each with the message timeout and broke the upload.
func TestSlowUploadAfterEarlyDecision(t *testing.T) {
	const timeout = 300 * time.Millisecond
	up := newUpstream(t, nil)
	picker := &testPicker{endpoints: up.addr(), decideOnHeaders: true}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker), ExtProcTimeout: timeout})
	body := `{"model":"m","prompt":"a slow upload"}`
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, body[:10])
		time.Sleep(4 * timeout)
		_, _ = io.WriteString(pw, body[10:])
		pw.Close()
	}()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %q", resp.StatusCode, got)
	}
	if saw := <-up.got; string(saw.body) != body {
		t.Fatalf("upstream got %q, want %q", saw.body, body)
	}
}
