package sidecar

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

type usageOut struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	Details          *struct {
		Cached int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// streamUsage reads an SSE answer: the concatenated text and the usage
// chunk, and checks it ends with data: [DONE].
func streamUsage(t *testing.T, raw []byte) (string, usageOut) {
	t.Helper()
	var text strings.Builder
	var u usageOut
	done := false
	for _, payload := range testutil.SSEData(raw) {
		if payload == "[DONE]" {
			done = true
			continue
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *usageOut `json:"usage"`
		}
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			t.Fatalf("chunk %q: %v", payload, err)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
		}
		if c.Usage != nil {
			u = *c.Usage
		}
	}
	if !done {
		t.Fatalf("stream did not end with [DONE]:\n%s", raw)
	}
	return text.String(), u
}

// TestPDWithSims runs the nixlv2 protocol between two real simulators, the
// picker's header set by the client: the decode sim counts the pulled KV,
// the client sees the prefiller's cached_tokens, and the prefiller's held
// blocks are released.
func TestPDWithSims(t *testing.T) {
	prefiller := startSim(t, vllmserver.RolePrefill)
	decoder := startSim(t, vllmserver.RoleDecode)
	// The sidecar's own address is a pool member too, as the decode pod's.
	pool := poolFile(t, simAddr(prefiller))
	sc, url := startSidecar(t, testOptions(simPort(decoder), pool))
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 12)

	for _, tc := range []struct {
		name   string
		stream bool
		warm   bool // the prefiller has the prompt cached already
	}{
		{"json cold", false, false},
		{"json warm", false, true},
		{"sse warm", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prompt + tc.name
			wantCached := 0
			if tc.warm {
				// A first P/D request leaves the prompt's blocks in the
				// prefiller's cache.
				if st, _, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: simAddr(prefiller)},
					map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": p, "max_tokens": 2}); st != http.StatusOK {
					t.Fatalf("warm-up: %d %s", st, raw)
				}
				wantCached = -1 // some full blocks, checked below
			}
			body := map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": p, "max_tokens": 7, "stream": tc.stream}
			if tc.stream {
				body["stream_options"] = map[string]any{"include_usage": true}
			}
			st, _, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: "http://" + simAddr(prefiller)}, body)
			if st != http.StatusOK {
				t.Fatalf("status %d: %s", st, raw)
			}
			var u usageOut
			if tc.stream {
				_, u = streamUsage(t, raw)
			} else {
				var ans struct {
					Usage usageOut `json:"usage"`
				}
				if err := json.Unmarshal(raw, &ans); err != nil {
					t.Fatal(err)
				}
				u = ans.Usage
			}
			if u.CompletionTokens != 7 || u.Details == nil {
				t.Fatalf("usage %+v: want 7 tokens from the decoder and prompt_tokens_details", u)
			}
			switch {
			case wantCached == 0 && u.Details.Cached != 0:
				t.Fatalf("cold prefiller: cached_tokens %d, want the prefiller's 0 (the decoder pulled all)", u.Details.Cached)
			case wantCached < 0 && (u.Details.Cached == 0 || u.Details.Cached%16 != 0):
				t.Fatalf("warm prefiller: cached_tokens %d, want the prefiller's full-block hit", u.Details.Cached)
			}
		})
	}
	// Every decode leg pulled from the prefiller and released its blocks.
	deadline := time.Now().Add(testTimeout)
	for prefiller.Engine().Metrics().HeldRequests != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("prefiller still holds %d requests' blocks", prefiller.Engine().Metrics().HeldRequests)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := counter(t, sc, "llm_d_disagg_sidecar_disagg_requests_total"); got != 5 {
		t.Fatalf("disagg_requests_total %v, want 5", got)
	}
}

// counter sums a metric family of a sidecar's or a sim's registry.
func counter(t *testing.T, s interface{ Registry() *prometheus.Registry }, name string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestDecodeOnlyAndPassthrough: without a prefill header the request goes
// to the model server untouched; other paths too; /health is the
// sidecar's own.
func TestDecodeOnlyAndPassthrough(t *testing.T) {
	decoder := newRecorder(t, func(w http.ResponseWriter, _ int, l leg) {
		writeJSONReply(w, http.StatusOK, map[string]any{"path": l.Path})
	})
	_, url := startSidecar(t, testOptions(decoder.port(), poolFile(t, "127.0.0.1:1")))
	if st, _, raw := post(t, url+"/v1/chat/completions", nil, map[string]any{"model": "m", "messages": []any{}}); st != http.StatusOK {
		t.Fatalf("decode-only: %d %s", st, raw)
	}
	resp, err := http.Get(url + "/metrics")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(url + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /health: %v %v", resp, err)
	}
	resp.Body.Close()
	got := decoder.got()
	if len(got) != 2 || got[0].Path != "/v1/chat/completions" || got[1].Path != "/metrics" {
		t.Fatalf("decoder saw %+v", got)
	}
	if got[0].Body["kv_transfer_params"] != nil {
		t.Fatalf("decode-only request was rewritten: %v", got[0].Body)
	}
}

// TestDecoderDown: a model server that cannot be reached gives llm-d's
// vLLM-shaped 503.
func TestDecoderDown(t *testing.T) {
	// A port bound to a socket that never listens: refused for the whole
	// test, and no other process (nor the sidecar) can be given it.
	_, port, err := net.SplitHostPort(testutil.RefusedAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	_, url := startSidecar(t, testOptions(p, ""))
	st, _, raw := post(t, url+"/v1/completions", nil, map[string]any{"model": "m", "prompt": "x"})
	var e apiError
	if st != http.StatusServiceUnavailable || json.Unmarshal(raw, &e) != nil || e.Object != "error" ||
		e.Type != "ServiceUnavailable" || e.Code != 503 || !strings.Contains(e.Message, "decode node is not ready") {
		t.Fatalf("got %d %s", st, raw)
	}
}
