package sidecar

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// prefillAnswer is what vLLM's NixlConnector returns on a prefill leg.
var prefillAnswer = map[string]any{
	"id": "cmpl-p", "object": "text_completion", "choices": []any{map[string]any{"index": 0, "text": "x", "finish_reason": "length"}},
	"usage": map[string]any{"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41, "prompt_tokens_details": map[string]any{"cached_tokens": 32}},
	"kv_transfer_params": map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []any{1.0, 2.0},
		"remote_engine_id": "eng-p", "remote_request_id": "cmpl-p", "remote_host": "10.0.0.9", "remote_port": 5600.0, "tp_size": 1.0},
}

// TestNIXLV2Legs checks both legs of every intercepted API byte for byte
// where llm-d fixes them, and the cached_tokens the client sees.
func TestNIXLV2Legs(t *testing.T) {
	for _, tc := range []struct {
		path      string
		body      map[string]any
		wantPre   map[string]any // fields of the prefill leg (beyond kv_transfer_params)
		absentPre []string
	}{
		{"/v1/chat/completions",
			map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "max_tokens": 50.0,
				"min_tokens": 3.0, "stream": true, "stream_options": map[string]any{"include_usage": true}, "temperature": 0.5},
			map[string]any{"max_tokens": 1.0, "max_completion_tokens": 1.0, "stream": false, "temperature": 0.5},
			[]string{"min_tokens", "stream_options"}},
		{"/v1/completions", map[string]any{"model": "m", "prompt": "hi", "max_tokens": 9.0},
			map[string]any{"max_tokens": 1.0, "stream": false}, []string{"max_completion_tokens"}},
		{"/v1/messages", map[string]any{"model": "m", "messages": []any{}, "max_tokens": 9.0},
			map[string]any{"max_tokens": 1.0, "stream": false}, nil},
		{"/v1/responses", map[string]any{"model": "m", "input": "hi", "max_output_tokens": 9.0},
			map[string]any{"max_output_tokens": 1.0, "stream": false, "store": false}, []string{"max_tokens"}},
		{"/inference/v1/generate", map[string]any{"model": "m", "token_ids": []any{1.0, 2.0}, "sampling_params": map[string]any{"max_tokens": 9.0, "min_tokens": 2.0, "top_p": 0.9}},
			map[string]any{"sampling_params": map[string]any{"max_tokens": 1.0, "top_p": 0.9}, "stream": false}, nil},
		{"/inference/v1/generate", map[string]any{"model": "m", "token_ids": []any{1.0}},
			map[string]any{"sampling_params": map[string]any{"max_tokens": 1.0}}, nil},
	} {
		t.Run(strings.TrimPrefix(tc.path, "/"), func(t *testing.T) {
			pre := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, prefillAnswer) })
			dec := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) {
				// vLLM's null prompt_tokens_details when nothing was cached.
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"d","usage":{"prompt_tokens":40,"completion_tokens":5,"prompt_tokens_details":null},"z":1}`)
			})
			_, url := startSidecar(t, testOptions(dec.port(), poolFile(t, pre.addr())))
			st, _, raw := post(t, url+tc.path, map[string]string{eppwire.HeaderPrefiller: pre.addr(),
				eppwire.HeaderEncoders: "10.9.9.9:1", "X-Request-Id": "client-id"}, tc.body)
			if st != http.StatusOK {
				t.Fatalf("%d %s", st, raw)
			}
			// The client sees the prefiller's cached_tokens, every other byte as
			// the decoder sent it.
			if want := `{"id":"d","usage":{"prompt_tokens":40,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":32}},"z":1}`; strings.TrimSpace(string(raw)) != want {
				t.Fatalf("answer\n%s\nwant\n%s", raw, want)
			}
			p, d := pre.got(), dec.got()
			if len(p) != 1 || len(d) != 1 {
				t.Fatalf("legs: %d prefill, %d decode", len(p), len(d))
			}
			pl, dl := p[0], d[0]
			if pl.Path != tc.path || dl.Path != tc.path {
				t.Fatalf("paths %s %s", pl.Path, dl.Path)
			}
			wantKV := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
				"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
			if !reflect.DeepEqual(pl.Body["kv_transfer_params"], wantKV) {
				t.Fatalf("prefill kv_transfer_params %v", pl.Body["kv_transfer_params"])
			}
			for k, v := range tc.wantPre {
				if !reflect.DeepEqual(pl.Body[k], v) {
					t.Fatalf("prefill %s = %v, want %v (leg %v)", k, pl.Body[k], v, pl.Body)
				}
			}
			for _, k := range tc.absentPre {
				if _, ok := pl.Body[k]; ok {
					t.Fatalf("prefill leg has %s: %v", k, pl.Body)
				}
			}
			// The decode leg is the client's body with the prefiller's params.
			want := map[string]any{}
			for k, v := range tc.body {
				want[k] = v
			}
			want["kv_transfer_params"] = prefillAnswer["kv_transfer_params"]
			if !reflect.DeepEqual(dl.Body, want) {
				t.Fatalf("decode leg\n%v\nwant\n%v", dl.Body, want)
			}
			for _, l := range []leg{pl, dl} {
				id := l.Header.Get("X-Request-Id")
				if id == "" || id == "client-id" || id != d[0].Header.Get("X-Request-Id") {
					t.Fatalf("x-request-id %q: want one fresh id on both legs", id)
				}
				for _, h := range append(append(prefillerHeaders, encoderHeaders...), kvSourceHeaders...) {
					if l.Header.Get(h) != "" {
						t.Fatalf("leg carries %s", h)
					}
				}
			}
		})
	}
}

// TestPrefillFailures: 502/503/504 are retried with backoff up to
// --prefill-max-retries; other errors and the last retry's answer reach
// the client as the prefiller sent them; an unreachable prefiller is a
// vLLM-shaped 502; a prefill answer without kv_transfer_params still
// decodes, with null.
func TestPrefillFailures(t *testing.T) {
	for _, tc := range []struct {
		name       string
		statuses   []int // the prefiller's answers in turn; then 200
		retries    int
		wantStatus int
		wantLegs   int
		decoded    bool
	}{
		{"503 then ok", []int{503, 503}, 2, 200, 3, true},
		{"504 out of retries", []int{504, 504, 504}, 1, 504, 2, false},
		{"502 no retries", []int{502}, 0, 502, 1, false},
		{"500 not retried", []int{500}, 3, 500, 1, false},
		{"400 not retried", []int{400}, 3, 400, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre := newRecorder(t, func(w http.ResponseWriter, n int, _ leg) {
				if n <= len(tc.statuses) {
					w.Header().Set("X-Prefiller", "yes")
					writeJSONReply(w, tc.statuses[n-1], map[string]any{"object": "error", "message": "busy", "code": tc.statuses[n-1]})
					return
				}
				writeJSONReply(w, http.StatusOK, map[string]any{"usage": map[string]any{}})
			})
			var decoded atomic.Int32
			dec := newRecorder(t, func(w http.ResponseWriter, _ int, l leg) {
				decoded.Add(1)
				if l.Body["kv_transfer_params"] != nil {
					t.Errorf("decode kv_transfer_params %v, want null", l.Body["kv_transfer_params"])
				}
				writeJSONReply(w, http.StatusOK, map[string]any{"usage": map[string]any{"prompt_tokens": 3}})
			})
			o := testOptions(dec.port(), poolFile(t, pre.addr()))
			o.PrefillMaxRetries, o.PrefillRetryBackoff = tc.retries, 0
			_, url := startSidecar(t, o)
			st, h, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: pre.addr()}, map[string]any{"model": "m", "prompt": "p"})
			if st != tc.wantStatus || len(pre.got()) != tc.wantLegs || (decoded.Load() == 1) != tc.decoded {
				t.Fatalf("status %d (%s), %d prefill legs, decoded %d", st, raw, len(pre.got()), decoded.Load())
			}
			if !tc.decoded && (h.Get("X-Prefiller") != "yes" || !strings.Contains(string(raw), "busy")) {
				t.Fatalf("the prefiller's answer was not passed through: %v %s", h, raw)
			}
		})
	}

	t.Run("unreachable", func(t *testing.T) {
		dec := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { t.Error("decoded without a prefill") })
		gone := newRecorder(t, nil)
		addr := gone.addr()
		o := testOptions(dec.port(), poolFile(t, addr))
		o.PrefillMaxRetries, o.PrefillRetryBackoff = 1, 0
		_, url := startSidecar(t, o)
		gone.srv.Close() // after the sidecar bound its port, which cannot be this one
		st, _, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: addr}, map[string]any{"model": "m", "prompt": "p"})
		var e apiError
		if st != http.StatusBadGateway || json.Unmarshal(raw, &e) != nil || e.Type != "BadGateway" || e.Object != "error" {
			t.Fatalf("%d %s", st, raw)
		}
	})
}
