package sidecar

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

// simKVBytesPerToken sizes the sims' KV blocks in the connector tests.
const simKVBytesPerToken = 256

// connectorAnswer posts a completion through the sidecar with the
// prefiller header and returns the usage the client saw.
func connectorAnswer(t *testing.T, url, prefiller string, body map[string]any) usageOut {
	t.Helper()
	st, _, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: prefiller}, body)
	if st != http.StatusOK {
		t.Fatalf("status %d: %s", st, raw)
	}
	if body["stream"] == true {
		_, u := streamUsage(t, raw)
		return u
	}
	var ans struct {
		Usage usageOut `json:"usage"`
	}
	if err := json.Unmarshal(raw, &ans); err != nil {
		t.Fatal(err)
	}
	return ans.Usage
}

// loadedTokens is what a decode sim's connector loaded, in tokens, and
// how many loaded blocks failed their byte check.
func loadedTokens(t *testing.T, s *vllmserver.Server) (tokens int, bad float64) {
	t.Helper()
	return int(counter(t, s, "kvgate_sim_kv_connector_loaded_bytes_total")) / simKVBytesPerToken,
		counter(t, s, "kvgate_sim_kv_connector_verify_failures_total")
}

// TestOffloadingWithSims runs --kv-connector offloading between two real
// sims running vLLM's OffloadingConnector with a p2p tier: both legs go
// out at once, the decode sim waits for the prefill's blocks in the
// prefill sim's tier and loads them (every byte checked), so the client
// sees them as cached.
func TestOffloadingWithSims(t *testing.T) {
	cfg := `{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":` +
		`{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":8388608,"secondary_tiers":[{"type":"p2p","host":"127.0.0.1","port":0}]}}`
	set := func(o *vllmserver.Options) { o.KVTransferConfig, o.KVBytesPerToken = cfg, simKVBytesPerToken }
	prefiller := startSimWith(t, vllmserver.RolePrefill, set)
	decoder := startSimWith(t, vllmserver.RoleDecode, set)
	o := testOptions(simPort(decoder), poolFile(t, simAddr(prefiller)))
	o.KVConnector = ConnectorOffloading
	o.P2PConnectorPort = prefiller.P2PAddr().(*net.TCPAddr).Port
	sc, url := startSidecar(t, o)
	for i, stream := range []bool{false, true} {
		body := map[string]any{"model": "Qwen/Qwen3-0.6B", "max_tokens": 5, "stream": stream,
			"prompt": strings.Repeat(fmt.Sprintf("Request %d's prompt travels through the p2p tier. ", i), 8)}
		if stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		before, _ := loadedTokens(t, decoder)
		u := connectorAnswer(t, url, simAddr(prefiller), body)
		after, bad := loadedTokens(t, decoder)
		want := (u.PromptTokens - 1) / 16 * 16
		if u.CompletionTokens != 5 || u.Details == nil || u.Details.Cached != want || after-before != want || bad != 0 {
			t.Fatalf("stream=%v: usage %+v; decoder loaded %d tokens (want %d), %v bad blocks", stream, u, after-before, want, bad)
		}
	}
	if got := counter(t, sc, "llm_d_disagg_sidecar_disagg_requests_total"); got != 2 {
		t.Fatalf("disagg_requests_total %v, want 2", got)
	}
}

// TestSharedStorageWithSims runs --kv-connector shared-storage between two
// real sims running vLLM's SharedStorageConnector on one folder: a request
// with cache_hit_threshold tries the decoder, which turns it away
// (cache_threshold); the prefill sim writes the prompt's blocks, the
// decoder loads and checks them. The same prompt again is decoded with no
// prefill leg.
func TestSharedStorageWithSims(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared-kv")
	cfg := fmt.Sprintf(`{"kv_connector":"SharedStorageConnector","kv_role":"kv_both","kv_connector_extra_config":{"shared_storage_path":%q}}`, dir)
	set := func(o *vllmserver.Options) { o.KVTransferConfig, o.KVBytesPerToken = cfg, simKVBytesPerToken }
	prefiller := startSimWith(t, vllmserver.RolePrefill, set)
	decoder := startSimWith(t, vllmserver.RoleDecode, set)
	o := testOptions(simPort(decoder), poolFile(t, simAddr(prefiller)))
	o.KVConnector = ConnectorSharedStorage
	_, url := startSidecar(t, o)
	prompt := strings.Repeat("The shared folder holds this prompt's KV blocks. ", 8)
	body := map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 4, "cache_hit_threshold": 0.5}
	prefills := func() int64 { return prefiller.Engine().Metrics().PromptTokens }

	u := connectorAnswer(t, url, simAddr(prefiller), body)
	loaded, bad := loadedTokens(t, decoder)
	want := (u.PromptTokens - 1) / 16 * 16
	if u.CompletionTokens != 4 || loaded != want || bad != 0 || prefills() != int64(u.PromptTokens) {
		t.Fatalf("cold: usage %+v; decoder loaded %d tokens (want %d), %v bad; prefiller computed %d prompt tokens", u, loaded, want, bad, prefills())
	}
	if n := counter(t, decoder, "kvgate_sim_cache_threshold_misses_total"); n != 1 {
		t.Fatalf("decoder threshold misses %v, want 1", n)
	}

	body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true}
	u = connectorAnswer(t, url, simAddr(prefiller), body)
	if u.CompletionTokens != 4 || u.Details == nil || u.Details.Cached < want || prefills() != int64(u.PromptTokens) {
		t.Fatalf("warm: usage %+v, prefiller computed %d prompt tokens (want no second prefill)", u, prefills())
	}
	if n := counter(t, decoder, "kvgate_sim_cache_threshold_misses_total"); n != 1 {
		t.Fatalf("decoder threshold misses %v after a warm request, want still 1", n)
	}
}
