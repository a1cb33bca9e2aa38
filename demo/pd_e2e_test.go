package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/sidecar"
)

// startPDStack starts a P/D fleet the test's cleanup stops.
func startPDStack(t *testing.T, shape PDShape) *PDStack {
	t.Helper()
	return startPDStackWith(t, shape, nil)
}

// startPDStackWith is startPDStack with the configuration changed by set
// first (nil: none).
func startPDStackWith(t *testing.T, shape PDShape, set func(*PDConfig)) *PDStack {
	t.Helper()
	c := PDConfig{Shape: shape, Decider: DeciderAlways, KVBytesPerToken: 1024, KVRegionDir: t.TempDir()}
	c.Bin, c.Wasm, c.TokenizerDir, c.HashSeed = testBin, testWasm, testTokDir, "42"
	c.LogDir, c.TimeScale, c.NumGPUBlocks, c.Ready = t.TempDir(), 1, 2048, 30*time.Second
	if set != nil {
		set(&c)
	}
	s, err := StartPDStack(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pids := s.PIDs()
		s.Close()
		assertGone(t, pids)
	})
	return s
}

// simCounter sums one counter family of a sim's /metrics.
func simCounter(t *testing.T, addr, name string) float64 {
	t.Helper()
	fams, err := families(t.Context(), http.DefaultClient, addr)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, m := range fams[name].GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// TestE2EPDThroughTheGateway: a streamed request through kvgate gateway →
// picker (disagg-profile-handler) → kvgate sidecar → prefill sim; its KV
// moves prefill sim → agents → decode sim (every byte checked there), and
// the decode sim's stream comes back with the prefiller's cached_tokens.
func TestE2EPDThroughTheGateway(t *testing.T) {
	needE2E(t)
	s := startPDStack(t, PDShape{Prefill: 1, Decode: 2})
	prompt := strings.Repeat("Disaggregated serving moves the prompt's KV cache from the prefill server to the decoder. ", 20)
	pre := s.Prefill[0].Addr
	for round, warm := range []bool{false, true} {
		hitsBefore := simCounter(t, pre, "vllm:prefix_cache_hits_total")
		var pulls, bytes0 float64
		for _, d := range s.Decode {
			pulls += simCounter(t, d.Addr, "kvgate_sim_kv_pulls_total")
			bytes0 += simCounter(t, d.Addr, "kvgate_sim_kv_pulled_bytes_total")
		}
		text, u := streamThrough(t, s.GatewayURL, prompt)
		if text == "" || u.CompletionTokens != 8 {
			t.Fatalf("round %d: text %q, usage %+v", round, text, u)
		}
		// The client sees the prefiller's own prefix-cache hit: none on the
		// first round (though the decoder had all but the last token
		// pulled), the prompt's cached blocks on the second.
		hits := simCounter(t, pre, "vllm:prefix_cache_hits_total") - hitsBefore
		if float64(u.CachedTokens) != hits || (warm && hits == 0) || (!warm && hits != 0) {
			t.Fatalf("round %d: client cached_tokens %d, prefiller's hits %v", round, u.CachedTokens, hits)
		}
		var pullsAfter, bytes1, bad float64
		for _, d := range s.Decode {
			pullsAfter += simCounter(t, d.Addr, "kvgate_sim_kv_pulls_total")
			bytes1 += simCounter(t, d.Addr, "kvgate_sim_kv_pulled_bytes_total")
			bad += simCounter(t, d.Addr, "kvgate_sim_kv_verify_failures_total")
		}
		wantBytes := float64(u.PromptTokens / kvhash.DefaultBlockSize * kvhash.DefaultBlockSize * 1024)
		if pullsAfter-pulls != 1 || bytes1-bytes0 != wantBytes || bad != 0 {
			t.Fatalf("round %d: %v pulls, %v bytes (want %v: the prompt's full blocks), %v verify failures", round, pullsAfter-pulls, bytes1-bytes0, wantBytes, bad)
		}
	}
	pr, err := s.Collect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if p, _, _ := pr.TotalPulls(); p != 2 || len(pr.Pairs) == 0 {
		t.Fatalf("report %+v", pr)
	}
}

// TestE2EPDConnectorsThroughTheGateway: the offloading and shared-storage
// connectors end to end, as TestE2EPDThroughTheGateway runs nixlv2: a
// streamed request through kvgate gateway → picker → kvgate sidecar
// --kv-connector → prefill sim, whose KV the decode sim loads — from the
// prefill sim's p2p tier while both legs run at once (offloading), or from
// the folder the prefill sim wrote after the decoder turned the request
// away under its cache_hit_threshold (shared-storage) — every byte
// checked, and whose answer streams back showing the loaded tokens as
// cached.
func TestE2EPDConnectorsThroughTheGateway(t *testing.T) {
	needE2E(t)
	for _, conn := range []string{sidecar.ConnectorOffloading, sidecar.ConnectorSharedStorage} {
		t.Run(conn, func(t *testing.T) {
			var progress []string // StartPDStack reports from this goroutine
			s := startPDStackWith(t, PDShape{Prefill: 1, Decode: 1}, func(c *PDConfig) {
				c.KVConnector = conn
				c.Progress = func(l string) { progress = append(progress, l) }
			})
			if p := strings.Join(progress, "\n"); !strings.Contains(p, kvPath(conn)) || strings.Contains(p, "node agents ready") {
				t.Fatalf("progress of a %s fleet, want how its KV moves and no node agents:\n%s", conn, p)
			}
			prompt := strings.Repeat("The "+conn+" connector carries this prompt's KV to the decoder. ", 12)
			extra := map[string]any{}
			if conn == sidecar.ConnectorSharedStorage {
				extra["cache_hit_threshold"] = 0.5
			}
			text, u := streamThrough(t, s.GatewayURL, prompt, extra)
			dec := s.Decode[0].Addr
			loaded := simCounter(t, dec, "kvgate_sim_kv_connector_loaded_bytes_total")
			bad := simCounter(t, dec, "kvgate_sim_kv_connector_verify_failures_total")
			want := (u.PromptTokens - 1) / kvhash.DefaultBlockSize * kvhash.DefaultBlockSize
			if text == "" || u.CompletionTokens != 8 || want == 0 || u.CachedTokens != want || loaded != float64(want*1024) || bad != 0 {
				t.Fatalf("text %q, usage %+v; decoder loaded %v bytes (want %d), %v bad blocks", text, u, loaded, want*1024, bad)
			}
			if conn == sidecar.ConnectorSharedStorage {
				if n := simCounter(t, dec, "kvgate_sim_cache_threshold_misses_total"); n != 1 {
					t.Fatalf("decoder threshold misses %v, want the one before the prefill", n)
				}
			}
			if got := simCounter(t, s.Prefill[0].Addr, "kvgate_sim_kv_connector_stored_blocks_total"); got < float64(want/kvhash.DefaultBlockSize) {
				t.Fatalf("prefill sim stored %v blocks, want at least %d", got, want/kvhash.DefaultBlockSize)
			}
			// kvgate up --pd's report counts the connector's loads as the
			// fleet's transfers.
			r, err := s.Collect(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if pulls, bytes, bad := r.TotalPulls(); pulls != 1 || bytes != loaded || bad != 0 {
				t.Fatalf("report: %v transfers of %v bytes, %v bad; want the decoder's one load of %v bytes", pulls, bytes, bad, loaded)
			}
		})
	}
}

type streamedUsage struct {
	PromptTokens, CompletionTokens, CachedTokens int
}

// streamThrough streams a completion of prompt, 8 tokens, through the
// gateway, with the fields of extra added to the body; it returns the text
// and the usage chunk.
func streamThrough(t *testing.T, gateway, prompt string, extra ...map[string]any) (string, streamedUsage) {
	t.Helper()
	fields := map[string]any{"model": Model, "prompt": prompt, "max_tokens": 8, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	for _, e := range extra {
		for k, v := range e {
			fields[k] = v
		}
	}
	body, _ := json.Marshal(fields)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gateway+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	// A client's own prefiller is dropped by the gateway: it must not
	// choose where the prompt goes.
	req.Header.Set("x-prefiller-host-port", "127.0.0.1:1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var text strings.Builder
	var u streamedUsage
	done := false
	sse := testutil.NewSSEReader(resp.Body)
	for {
		payload, err := sse.NextData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if payload == "[DONE]" {
			done = true
			break
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
				Details    struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			t.Fatalf("chunk %q: %v", payload, err)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
		}
		if c.Usage != nil {
			u = streamedUsage{c.Usage.Prompt, c.Usage.Completion, c.Usage.Details.Cached}
		}
	}
	if !done {
		t.Fatal("stream ended without [DONE]")
	}
	return text.String(), u
}

// TestE2EUpPD: `kvgate up --pd 1P2D --requests 50` exits 0 and reports
// the P/D pairs and the KV transfers: every request disaggregated, every
// transfer verified. (It found a prefill server naming blocks to its
// decoder before their bytes were written, see dataPlane.store, two
// regions' slot races, and a block hasher shared between request
// goroutines that made prefill and decode legs disagree on a block's hash
// under load, see dataPlane.hashers.)
func TestE2EUpPD(t *testing.T) {
	needE2E(t)
	cmd, buf := upCommand(t, "--pd", "1P2D", "--requests", "50", "--duration", "4s", "--time-scale", "0.5")
	if err := cmd.Run(); err != nil {
		t.Fatalf("kvgate up --pd: %v\n%s", err, buf)
	}
	out := buf.String()
	for _, want := range []string{"collocated-3", "50/50", "P/D pairs", "prefill-0 -> decode-", "KV transfers", "ITL p50"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Every request was disaggregated (always-disagg-pd-decider): 50
	// transfers in all, none failed, every one verified (the sims' byte
	// check counts any block that arrived wrong as corrupt).
	total, corrupt := 0, 0
	for _, m := range regexp.MustCompile(`(?m)^\s+decode-\d+\s+(\d+)\s+\d+\s+\d+\s+[\d.]+\s+0\s+(\d+)\s*$`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		c, _ := strconv.Atoi(m[2])
		total, corrupt = total+n, corrupt+c
	}
	if total != 50 || corrupt != 0 {
		t.Errorf("transfers reported: %d verified + %d corrupt, want 50 verified (none failed, none corrupt):\n%s", total, corrupt, out)
	}
	dir := cmd.Args[3]
	if fi, err := os.Stat(filepath.Join(dir, "results.json")); err != nil || fi.Size() == 0 {
		t.Errorf("results.json: %v", err)
	}
	if pids := ownProcesses(t); len(pids) > 0 {
		t.Errorf("processes left behind: %v\n%s", pids, out)
	}
}

// TestE2EEPDThroughTheGateway: a chat request with an image goes gateway →
// picker (encode, prefill and decode profiles) → sidecar, which fans the
// image out to the encode sim and hands its ec_transfer_params to the
// prefill leg; the prefill sim runs no encoder of its own, the decode sim
// pulls the KV. The same image again is an encoder-cache hit.
func TestE2EEPDThroughTheGateway(t *testing.T) {
	needE2E(t)
	s := startPDStack(t, PDShape{Encode: 1, Prefill: 1, Decode: 1})
	body, _ := json.Marshal(map[string]any{"model": Model, "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "http://images.example/cat.png"}},
		map[string]any{"type": "text", "text": "What is in the picture?"}}}}})
	for round := 1; round <= 2; round++ {
		resp, err := http.Post(s.GatewayURL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("round %d: %d %s", round, resp.StatusCode, raw)
		}
		enc, pre, dec := s.Encode[0].Addr, s.Prefill[0].Addr, s.Decode[0].Addr
		if runs, hits := simCounter(t, enc, "kvgate_sim_encoder_runs_total"), simCounter(t, enc, "kvgate_sim_encoder_cache_hits_total"); runs != 1 || hits != float64(round-1) {
			t.Fatalf("round %d: encode sim ran the encoder %v times, %v cache hits", round, runs, hits)
		}
		if runs, remote := simCounter(t, pre, "kvgate_sim_encoder_runs_total"), simCounter(t, pre, "kvgate_sim_encoder_remote_total"); runs != 0 || remote != float64(round) {
			t.Fatalf("round %d: prefill sim ran %v encoder passes, used %v remote outputs", round, runs, remote)
		}
		if pulls := simCounter(t, dec, "kvgate_sim_kv_pulls_total"); pulls != float64(round) || simCounter(t, dec, "kvgate_sim_kv_verify_failures_total") != 0 {
			t.Fatalf("round %d: decode sim pulls %v", round, pulls)
		}
	}
}
