package vllmserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzGenerate sends arbitrary bodies to both generation endpoints: the
// handler never panics and always answers JSON (an SSE stream of JSON
// chunks for a streamed success), with vLLM's error shape on failure.
func FuzzGenerate(f *testing.F) {
	for _, seed := range []string{
		`{"model":"Qwen/Qwen3-0.6B","prompt":"hello","max_tokens":3}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":[[1,2],[3]],"max_tokens":1}`,
		`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"assistant"}]}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":"x","kv_transfer_params":{"do_remote_decode":true}}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_host":"","remote_port":1}}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":"x","max_tokens":100000}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":"x","cache_salt":"s","max_tokens":0}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":"x y z","cache_hit_threshold":0.9,"stream":true}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":"x","cache_hit_threshold":-1}`,
		`{"model":"Qwen/Qwen3-0.6B","prompt":"x","kv_transfer_params":{"remote_prefiller":{"kv_request_id":"a","remote_host":"127.0.0.1","remote_port":1}}}`,
		`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="},"uuid":"u"}]}]}`,
		`{"model":"other","prompt":"x"}`,
		`{"model":1}`, `[]`, `null`, `{"model":"Qwen/Qwen3-0.6B","prompt":""}`, `{`, "",
	} {
		f.Add(false, seed)
		f.Add(true, seed)
	}
	o := testOptions(f)
	o.TimeScale, o.MaxModelLen, o.MaxWaiting = 1000, 256, 64
	s := startServer(f, o)
	h := s.Handler()
	f.Fuzz(func(t *testing.T, chat bool, body string) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		raw := rec.Body.Bytes()
		if rec.Header().Get("Content-Type") == "text/event-stream; charset=utf-8" {
			if rec.Code != http.StatusOK {
				t.Fatalf("stream with status %d", rec.Code)
			}
			events := sseEvents(t, raw)
			if len(events) == 0 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("stream %q does not end with [DONE]", raw)
			}
			for _, e := range events[:len(events)-1] {
				if !json.Valid([]byte(e)) {
					t.Fatalf("chunk %q is not JSON", e)
				}
			}
			return
		}
		if !json.Valid(raw) {
			t.Fatalf("status %d, body %q is not JSON", rec.Code, raw)
		}
		if rec.Code != http.StatusOK {
			if e, err := errorBody(raw); err != nil || e.Code != rec.Code {
				t.Fatalf("status %d, error body %s", rec.Code, raw)
			}
		}
	})
}
