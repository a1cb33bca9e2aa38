package sidecar

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzSetPath: on any JSON object the result is a JSON object whose
// usage.prompt_tokens_details.cached_tokens is the value set and whose
// other top-level keys are unchanged; anything else is an error, never a
// panic.
func FuzzSetPath(f *testing.F) {
	for _, s := range []string{`{}`, `{"usage":null}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":1}}}`, `{"a":[{"usage":1}],"usage":{}}`, `{"usage":{"usage":{}}}`, `[1]`, `{"a":1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		out, err := setPath(doc, json.RawMessage("12"), "usage", "prompt_tokens_details", "cached_tokens")
		var in map[string]json.RawMessage
		if json.Unmarshal(doc, &in) != nil || in == nil {
			return // not an object: an error or a best effort, but no panic
		}
		if err != nil {
			// A valid object with a repeated key encoding/json accepts is
			// still rewritten; other errors would be a bug.
			t.Fatalf("setPath(%q): %v", doc, err)
		}
		var got struct {
			Usage struct {
				Details struct {
					Cached *int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(out, &top); err != nil || json.Unmarshal(out, &got) != nil {
			t.Fatalf("setPath(%q) = %q: not a JSON object", doc, out)
		}
		if got.Usage.Details.Cached == nil || *got.Usage.Details.Cached != 12 {
			t.Fatalf("setPath(%q) = %q: cached_tokens not 12", doc, out)
		}
		for k, v := range in {
			if k != "usage" && string(top[k]) != string(v) {
				t.Fatalf("setPath(%q) changed %q", doc, k)
			}
		}
	})
}

// FuzzUsageWriterSSE: a stream cut at any point into two writes comes out
// the same as written whole.
func FuzzUsageWriterSSE(f *testing.F) {
	f.Add([]byte(sseStream), 5)
	f.Add([]byte("data: {\"usage\":{}}\r\ndata:{\"usage\":{\"prompt_tokens_details\":null}}"), 3)
	f.Add([]byte("data: [DONE]\n\n"), 0)
	f.Fuzz(func(t *testing.T, stream []byte, cut int) {
		run := func(parts ...[]byte) string {
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", "text/event-stream")
			u := newUsageWriter(rec, 4)
			u.WriteHeader(http.StatusOK)
			for _, p := range parts {
				_, _ = u.Write(p)
			}
			_ = u.finish()
			return rec.Body.String()
		}
		if cut < 0 {
			cut = -cut
		}
		cut %= len(stream) + 1
		whole := run(stream)
		if split := run(stream[:cut], stream[cut:]); split != whole {
			t.Fatalf("cut at %d: %q != %q", cut, split, whole)
		}
	})
}

// FuzzHeaders: the routing headers' parser never panics, and what it
// accepts reparses to itself.
func FuzzHeaders(f *testing.F) {
	for _, s := range []string{"10.0.0.1:8000", "http://[::1]:80, a:1", "x", ",,", "[::ffff:1.2.3.4]:9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		hosts, err := splitHosts([]string{v})
		if err != nil {
			return
		}
		for _, h := range hosts {
			hp, err := parseHostPort(h)
			if err != nil {
				continue
			}
			if again, err := parseHostPort(hp); err != nil || again != hp {
				t.Fatalf("parseHostPort(%q) = %q, reparsed %q %v", h, hp, again, err)
			}
		}
	})
}
