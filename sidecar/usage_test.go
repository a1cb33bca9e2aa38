package sidecar

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestSetPath(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}`, `{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":7}}}`},
		{`{"usage":{"prompt_tokens":3,"prompt_tokens_details":null}}`, `{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":7}}}`},
		{`{"usage":{"prompt_tokens":3}}`, `{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":7}}}`},
		{`{"usage":{}}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":7}}}`},
		{` { "usage" : { "prompt_tokens_details" : { "cached_tokens" : 1 , "x":2 } } } `, ` { "usage" : { "prompt_tokens_details" : { "cached_tokens" : 7 , "x":2 } } } `},
		{`{"a":"}{","usage":{"prompt_tokens_details":{"audio_tokens":1}},"b":[1,{"usage":2}]}`, `{"a":"}{","usage":{"prompt_tokens_details":{"audio_tokens":1,"cached_tokens":7}},"b":[1,{"usage":2}]}`},
		{`{"usage":{"prompt_tokens_details":5}}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":7}}}`},
	} {
		got, err := setPath([]byte(tc.doc), json.RawMessage("7"), "usage", "prompt_tokens_details", "cached_tokens")
		if err != nil || string(got) != tc.want {
			t.Errorf("setPath(%s)\n got %s %v\nwant %s", tc.doc, got, err, tc.want)
		}
	}
	for _, bad := range []string{``, `[]`, `{"a":}`, `{"a":1} x`, `"s"`} {
		if _, err := setPath([]byte(bad), json.RawMessage("7"), "a"); err == nil {
			t.Errorf("setPath(%q): no error", bad)
		}
	}
}

func TestRewriteUsage(t *testing.T) {
	for _, tc := range []struct {
		doc     string
		changed bool
	}{
		{`{"usage":null,"choices":[]}`, false},
		{`{"choices":[{"text":"a"}]}`, false},
		{`{"usage":{"prompt_tokens":1}}`, true},
		{`not json`, false},
		{`[DONE]`, false},
	} {
		_, changed := rewriteUsage([]byte(tc.doc), 9)
		if changed != tc.changed {
			t.Errorf("rewriteUsage(%s): changed %v", tc.doc, changed)
		}
	}
}

// sseStream is a vLLM stream whose usage chunk reports 0 cached tokens.
const sseStream = "data: {\"id\":\"c\",\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n" +
	": comment\r\n" +
	"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":null}}\r\n\r\n" +
	"data: [DONE]\n\n"

const sseWant = "data: {\"id\":\"c\",\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n" +
	": comment\r\n" +
	"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\r\n\r\n" +
	"data: [DONE]\n\n"

// TestUsageWriterSSE: however the stream is cut into writes, the client
// gets the same rewritten stream, line endings kept.
func TestUsageWriterSSE(t *testing.T) {
	for _, size := range []int{1, 2, 7, 50, len(sseStream)} {
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		rec.Header().Set("Content-Length", "999")
		u := newUsageWriter(rec, 32)
		u.WriteHeader(http.StatusOK)
		for s := sseStream; s != ""; {
			n := min(size, len(s))
			if _, err := u.Write([]byte(s[:n])); err != nil {
				t.Fatal(err)
			}
			u.Flush()
			s = s[n:]
		}
		if err := u.finish(); err != nil {
			t.Fatal(err)
		}
		if got := rec.Body.String(); got != sseWant {
			t.Fatalf("writes of %d bytes:\n%q\nwant\n%q", size, got, sseWant)
		}
		if rec.Header().Get("Content-Length") != "" {
			t.Fatal("Content-Length kept on a rewritten stream")
		}
	}
}

// TestUsageWriterPassThrough: errors and other content types are not
// touched; JSON gets a correct Content-Length.
func TestUsageWriterPassThrough(t *testing.T) {
	for _, tc := range []struct {
		ct     string
		status int
		body   string
		want   string
	}{
		{"application/json", 400, `{"usage":{}}`, `{"usage":{}}`},
		{"text/plain", 200, `{"usage":{}}`, `{"usage":{}}`},
		{"application/json", 200, `{"usage":{}}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":3}}}`},
		{"application/json", 200, `not json`, `not json`},
	} {
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Type", tc.ct)
		u := newUsageWriter(rec, 3)
		u.WriteHeader(tc.status)
		_, _ = u.Write([]byte(tc.body))
		_ = u.finish()
		if rec.Code != tc.status || rec.Body.String() != tc.want {
			t.Errorf("%s %d: got %d %s", tc.ct, tc.status, rec.Code, rec.Body.String())
		}
		if cl := rec.Header().Get("Content-Length"); tc.ct == "application/json" && tc.status == 200 && cl != itoa(len(tc.want)) {
			t.Errorf("Content-Length %q", cl)
		}
	}
}

func itoa(n int) string { return strings.TrimSpace(string(must(json.Marshal(n)))) }

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestParseHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1:8000": "10.0.0.1:8000", "http://10.0.0.1:8000": "10.0.0.1:8000", "[::1]:80": "[::1]:80",
		"[::ffff:10.0.0.1]:80": "10.0.0.1:80", "[2001:DB8::1]:80": "[2001:db8::1]:80", "Pod-A:8000": "pod-a:8000",
	} {
		if got, err := parseHostPort(in); err != nil || got != want {
			t.Errorf("parseHostPort(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:70000", "https://10.0.0.1:80", "a@b:80", ":80", "h/x:80"} {
		if got, err := parseHostPort(bad); err == nil {
			t.Errorf("parseHostPort(%q) = %q, want an error", bad, got)
		}
	}
	hosts, err := splitHosts([]string{" a:1, ,b:2", "c:3"})
	if err != nil || strings.Join(hosts, " ") != "a:1 b:2 c:3" {
		t.Fatalf("splitHosts: %v %v", hosts, err)
	}
	if _, err := splitHosts([]string{strings.Repeat("a:1,", maxHostList+1)}); err == nil {
		t.Fatal("splitHosts took more than maxHostList")
	}
}

func TestCapSingleTokenKeepsOriginal(t *testing.T) {
	b, err := parseBody([]byte(`{"max_tokens":5,"stream":true,"sampling_params":{"max_tokens":5}}`))
	if err != nil {
		t.Fatal(err)
	}
	leg := b.clone()
	leg.capSingleToken(apis[4])
	if !bytes.Equal(b["sampling_params"], []byte(`{"max_tokens":5}`)) || string(b["stream"]) != "true" {
		t.Fatalf("original changed: %s", b.marshal())
	}
}
