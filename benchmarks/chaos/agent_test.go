package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/demo"
)

// agentKilled runs a 1P1D fleet (node agents, sidecar, disagg-profile-
// handler always disaggregating) whose simulators recompute a prompt whose
// KV cannot be pulled (vLLM's kv_load_failure_policy: recompute), and
// kills one node agent: requests before and after must all succeed, the
// later ones by recomputing on the decode server. which is "prefill" or
// "decode": whose agent dies.
func agentKilled(t *testing.T, bin, wasm, tok, which string) result {
	c := demo.PDConfig{Shape: demo.PDShape{Prefill: 1, Decode: 1}, Decider: demo.DeciderAlways, KVBytesPerToken: 1024, KVRegionDir: t.TempDir()}
	c.Bin, c.Wasm, c.TokenizerDir, c.HashSeed = bin, wasm, tok, "42"
	c.LogDir, c.TimeScale, c.NumGPUBlocks, c.Ready = t.TempDir(), 1, 2048, 60*time.Second
	c.SimArgs = []string{"--kv-load-failure-policy", "recompute"}
	s, err := demo.StartPDStack(context.Background(), c)
	if err != nil {
		return result{"P/D fleet for the agent check", false, err.Error()}
	}
	defer s.Close()
	send := func(n int, what string) map[int]int {
		codes := map[int]int{}
		for i := range n {
			body, _ := json.Marshal(map[string]any{"model": demo.Model, "max_tokens": 4,
				"prompt": fmt.Sprintf("%s request %d: a prompt long enough to fill several KV blocks of sixteen tokens each, so that the decode server has blocks to pull from the prefill server's agent", what, i)})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.GatewayURL+"/v1/completions", bytes.NewReader(body))
			req.Header.Set("content-type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			code := 0
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			cancel()
			codes[code]++
		}
		return codes
	}
	before := send(10, "before")
	victim := s.Agents[0] // the prefill server's
	if which == "decode" {
		victim = s.Agents[1]
	}
	_ = victim.Proc.Kill()
	<-victim.Proc.Done()
	after := send(20, "after")
	return result{fmt.Sprintf("the %s server's node agent killed (SIGKILL) in a 1P1D fleet, recompute policy", which),
		before[200] == 10 && after[200] == 20,
		fmt.Sprintf("10 requests before: %v; 20 after: %v", before, after)}
}
