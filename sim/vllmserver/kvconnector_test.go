package vllmserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/vllm"
)

const connectorKVBytes = 256 // per token: 4 KiB blocks

func sharedStorageServer(t *testing.T, dir string, role Role, policy string) *Server {
	t.Helper()
	o := testOptions(t)
	o.Role, o.KVBytesPerToken, o.KVLoadFailurePolicy = role, connectorKVBytes, policy
	o.KVTransferConfig = fmt.Sprintf(`{"kv_connector":"SharedStorageConnector","kv_role":"kv_both","kv_connector_extra_config":{"shared_storage_path":%q}}`, dir)
	return startServer(t, o)
}

// TestSharedStorageConnector: a prefill writes its prompt's blocks to the
// shared folder; a decoder asked with cache_hit_threshold first turns the
// request away (nothing stored yet), then loads every block the prefill
// wrote, byte-checked, counting them as cached; a corrupted file fails the
// load (fail) or is recomputed (recompute).
func TestSharedStorageConnector(t *testing.T) {
	dir := t.TempDir()
	pre := sharedStorageServer(t, dir, RolePrefill, PolicyFail)
	dec := sharedStorageServer(t, dir, RoleDecode, PolicyFail)
	prompt := strings.Repeat("Shared storage carries the prompt's KV between servers. ", 10)
	body := map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 4, "cache_hit_threshold": 0.5}

	r := complete(t, dec, "/v1/completions", body)
	if r.Choices[0].FinishReason == nil || *r.Choices[0].FinishReason != FinishCacheThreshold || r.Choices[0].Text != "" {
		t.Fatalf("cold decoder: %+v, want finish_reason cache_threshold and no text", r.Choices[0])
	}
	if got := counterValue(t, dec, "kvgate_sim_cache_threshold_misses_total"); got != 1 {
		t.Fatalf("threshold misses %v", got)
	}

	p := complete(t, pre, "/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 1, "cache_hit_threshold": 0})
	blocks := p.Usage.PromptTokens / 16
	files, _ := filepath.Glob(filepath.Join(dir, "*.kv"))
	if blocks == 0 || len(files) != blocks || counterValue(t, pre, "kvgate_sim_kv_connector_stored_blocks_total") != float64(blocks) {
		t.Fatalf("%d prompt blocks, %d files in the shared folder", blocks, len(files))
	}

	r = complete(t, dec, "/v1/completions", body)
	want := (p.Usage.PromptTokens - 1) / 16
	if r.Usage.CompletionTokens != 4 || r.Usage.PromptTokensDetails.CachedTokens != want*16 {
		t.Fatalf("warm decoder: usage %+v, want 4 tokens and %d cached (the loaded blocks)", r.Usage, want*16)
	}
	if got := counterValue(t, dec, "kvgate_sim_kv_connector_loaded_bytes_total"); got != float64(want*16*connectorKVBytes) {
		t.Fatalf("loaded %v bytes, want %d", got, want*16*connectorKVBytes)
	}

	// A block whose bytes changed on the storage is caught.
	if err := os.WriteFile(files[0], make([]byte, 16*connectorKVBytes), 0o644); err != nil {
		t.Fatal(err)
	}
	other := sharedStorageServer(t, dir, RoleDecode, PolicyFail)
	if st, raw := post(t, other.URL()+"/v1/completions", body); st != http.StatusInternalServerError || !strings.Contains(string(raw), "wrong byte") {
		t.Fatalf("corrupt block under fail: %d %s", st, raw)
	}
	lenient := sharedStorageServer(t, dir, RoleDecode, PolicyRecompute)
	delete(body, "cache_hit_threshold")
	if r := complete(t, lenient, "/v1/completions", body); r.Usage.CompletionTokens != 4 || r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("corrupt block under recompute: %+v", r.Usage)
	}
	if counterValue(t, other, "kvgate_sim_kv_connector_verify_failures_total") != 1 || counterValue(t, lenient, "kvgate_sim_kv_connector_verify_failures_total") != 1 {
		t.Fatal("verify failures not counted")
	}
}

func offloadingServer(t *testing.T, role Role) *Server {
	t.Helper()
	o := testOptions(t)
	o.Role, o.KVBytesPerToken, o.KVTransferTimeout = role, connectorKVBytes, 2*time.Second
	o.KVTransferConfig = `{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":1048576,"secondary_tiers":[{"type":"p2p","host":"127.0.0.1","port":0}]}}`
	return startServer(t, o)
}

// TestOffloadingConnector: the decode leg may arrive before the prefill
// leg has run (the sidecar sends both at once); it waits for the blocks to
// land in the prefiller's p2p tier and loads them, byte-checked.
func TestOffloadingConnector(t *testing.T) {
	pre := offloadingServer(t, RolePrefill)
	dec := offloadingServer(t, RoleDecode)
	_, port := splitAddr(t, pre.P2PAddr().String())
	prompt := strings.Repeat("Offloaded KV lands in the prefiller's p2p tier. ", 10)
	decoded := make(chan completionResponse, 1)
	go func() {
		decoded <- complete(t, dec, "/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 3,
			"kv_transfer_params": map[string]any{"remote_prefiller": map[string]any{"kv_request_id": "req-1", "remote_host": "127.0.0.1", "remote_port": port}}})
	}()
	p := complete(t, pre, "/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"remote_decoder": map[string]any{"kv_request_id": "req-1"}}})
	r := <-decoded
	want := (p.Usage.PromptTokens - 1) / 16 * 16
	if r.Usage.CompletionTokens != 3 || r.Usage.PromptTokensDetails.CachedTokens != want {
		t.Fatalf("decoder usage %+v, want 3 tokens and %d cached", r.Usage, want)
	}
	if got := counterValue(t, dec, "kvgate_sim_kv_connector_loaded_bytes_total"); got != float64(want*connectorKVBytes) {
		t.Fatalf("loaded %v bytes, want %d", got, want*connectorKVBytes)
	}
	// An id no prefill fills is a failed load (500 under fail), after the wait.
	st, raw := post(t, dec.URL()+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"remote_prefiller": map[string]any{"kv_request_id": "never", "remote_host": "127.0.0.1", "remote_port": port}}})
	if st != http.StatusInternalServerError {
		t.Fatalf("pull of a missing prefill: %d %s", st, raw)
	}
	// A waiter's entry goes with it: the tier keeps only the one prefill.
	waitFor(t, "the p2p tier to drop the unfilled entry", func() bool { return pre.kvc.tier.size() == 1 })
}

// TestOffloadingPullHosts: a decode leg pulls only from a loopback
// address, localhost or a host of --kv-allowed-hosts; any other
// remote_host is refused before a dial, counted, and is a failed load
// under the failure policy (vLLM's 500 under fail).
func TestOffloadingPullHosts(t *testing.T) {
	pre := offloadingServer(t, RolePrefill)
	dec := offloadingServer(t, RoleDecode)
	_, port := splitAddr(t, pre.P2PAddr().String())
	prompt := strings.Repeat("Only pull KV from hosts you were told of. ", 10)
	pull := func(host, id string) (int, []byte) {
		return post(t, dec.URL()+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 1,
			"kv_transfer_params": map[string]any{"remote_prefiller": map[string]any{"kv_request_id": id, "remote_host": host, "remote_port": port}}})
	}
	refused := []string{"192.0.2.1", "metadata.google.internal", "::ffff:10.1.2.3", "0.0.0.0"}
	for _, host := range refused {
		if st, raw := pull(host, "x"); st != http.StatusInternalServerError || !strings.Contains(string(raw), `"type":"InternalServerError"`) ||
			!strings.Contains(string(raw), "--kv-allowed-hosts") || !strings.Contains(string(raw), host) {
			t.Fatalf("remote_host %s: %d %s, want the 500 naming it", host, st, raw)
		}
	}
	if n := refusedDials(t, dec.Registry(), dialP2PPull); n != float64(len(refused)) {
		t.Fatalf("%v refused p2p pulls counted, want %d", n, len(refused))
	}
	if n := counterValue(t, dec, "kvgate_sim_kv_connector_load_failures_total"); n != float64(len(refused)) {
		t.Fatalf("%v load failures counted, want %d", n, len(refused))
	}
	// localhost is this machine: the prefill's blocks load from it.
	complete(t, pre, "/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"remote_decoder": map[string]any{"kv_request_id": "local"}}})
	if st, raw := pull("localhost", "local"); st != http.StatusOK || !strings.Contains(string(raw), `"cached_tokens":`) || strings.Contains(string(raw), `"cached_tokens":0`) {
		t.Fatalf("pull from localhost: %d %s, want cached tokens", st, raw)
	}

	// A tier that redirects is not followed: the pull would reach a host
	// never checked.
	var followed atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { followed.Add(1) }))
	t.Cleanup(target.Close)
	redirect := httptest.NewServer(http.RedirectHandler(target.URL+"/kvgate/p2p/local", http.StatusTemporaryRedirect))
	t.Cleanup(redirect.Close)
	_, rport := splitAddr(t, redirect.Listener.Addr().String())
	st, raw := post(t, dec.URL()+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"remote_prefiller": map[string]any{"kv_request_id": "local", "remote_host": "127.0.0.1", "remote_port": rport}}})
	if st != http.StatusInternalServerError || !strings.Contains(string(raw), "307") || followed.Load() != 0 {
		t.Fatalf("a redirecting tier: %d %s, %d requests to its target; want the failed load and none", st, raw, followed.Load())
	}
}

func splitAddr(t *testing.T, addr string) (string, int) {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	var port int
	if _, err := fmt.Sscan(addr[i+1:], &port); err != nil {
		t.Fatal(err)
	}
	return addr[:i], port
}

// TestKVTransferConfigRefused: what the simulator does not model is
// refused by name, never ignored.
func TestKVTransferConfigRefused(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{`{"kv_connector":"LMCacheConnectorV1"}`, "LMCacheConnectorV1"},
		{`{"kv_connector":"SharedStorageConnector","kv_buffer_size":1e9}`, "kv_buffer_size"},
		{`{"kv_connector":"SharedStorageConnector","kv_connector_extra_config":{"path":"/x"}}`, `"path"`},
		{`{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"spec_name":"CPUOffloadingSpec"}}`, "CPUOffloadingSpec"},
		{`{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","secondary_tiers":[{"type":"storage"}]}}`, "secondary_tiers"},
		{`{"kv_connector":"NixlConnector","kv_role":"kv_sender"}`, "kv_sender"},
		{`{"kv_connector":"NixlConnector","kv_connector_extra_config":{"backends":["UCX"]}}`, "extra_config"},
		{`not json`, "--kv-transfer-config"},
	} {
		o := testOptions(t)
		o.KVTransferConfig = tc.cfg
		if _, err := o.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	o := testOptions(t)
	o.KVTransferConfig, o.Agent = `{"kv_connector":"SharedStorageConnector"}`, "127.0.0.1:1"
	if _, err := o.validate(); err == nil || !strings.Contains(err.Error(), "--agent") {
		t.Errorf("with --agent: %v", err)
	}
	o = testOptions(t)
	o.Role, o.KVAllowedHosts = RolePrefill, []string{"10.0.0.7"}
	if _, err := o.validate(); err == nil || !strings.Contains(err.Error(), "--kv-allowed-hosts") {
		t.Errorf("--kv-allowed-hosts on a prefill leg that dials no peer: %v", err)
	}
	o.KVAllowedHosts = []string{"10.0.0.7:80"}
	o.Role = RoleDecode
	if _, err := o.validate(); err == nil || !strings.Contains(err.Error(), "10.0.0.7:80") {
		t.Errorf("--kv-allowed-hosts with a port: %v", err)
	}
	// Without the OffloadingConnector a remote_prefiller is refused.
	s := startServer(t, testOptions(t))
	st, raw := post(t, s.URL()+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": "hi",
		"kv_transfer_params": json.RawMessage(`{"remote_prefiller":{"kv_request_id":"x","remote_host":"127.0.0.1","remote_port":1}}`)})
	if st != http.StatusBadRequest || !strings.Contains(string(raw), ConnectorOffloading) {
		t.Fatalf("remote_prefiller without the connector: %d %s", st, raw)
	}
	if st, raw := post(t, s.URL()+"/v1/completions", map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": "hi", "cache_hit_threshold": 2}); st != http.StatusBadRequest {
		t.Fatalf("cache_hit_threshold 2: %d %s", st, raw)
	}
}

// size is how many entries the tier keeps, filled or waited for.
func (t *p2pTier) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// FuzzKVTransferConfig: any --kv-transfer-config is accepted as one of the
// modelled connectors, with its settings in range, or refused; never a
// panic.
func FuzzKVTransferConfig(f *testing.F) {
	f.Add(`{"kv_connector":"SharedStorageConnector","kv_connector_extra_config":{"shared_storage_path":"/x"}}`)
	f.Add(`{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":1,"secondary_tiers":[{"type":"p2p","host":"h","port":7777}]}}`)
	f.Add(`{"kv_connector":"NixlConnector","kv_connector_extra_config":null}`)
	f.Add(`{"kv_connector":"NixlConnector"} {}`)
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := parseKVTransferConfig(raw)
		if err != nil || c == nil {
			return
		}
		switch c.Connector {
		case ConnectorNixl:
		case ConnectorSharedStorage:
			if c.storagePath == "" {
				t.Fatalf("%s: no path", raw)
			}
		case ConnectorOffloading:
			if c.tierBytes <= 0 || c.p2pAddr == "" {
				t.Fatalf("%s: tier %d bytes at %q", raw, c.tierBytes, c.p2pAddr)
			}
		default:
			t.Fatalf("%s: accepted connector %q", raw, c.Connector)
		}
	})
}

// TestP2PTierRefusesBeforeAllocating: a prefill larger than the whole p2p
// tier is refused before its blocks are made, so that one long prompt does
// not allocate gigabytes (blocks are megabytes at the model's real size)
// only to drop them; one that fits is kept.
func TestP2PTierRefusesBeforeAllocating(t *testing.T) {
	const blockBytes = 1 << 20
	o := testOptions(t)
	o.Role, o.KVBytesPerToken = RolePrefill, blockBytes/16
	o.KVTransferConfig = `{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec",` +
		`"cpu_bytes_to_use":4194304,"secondary_tiers":[{"type":"p2p","host":"127.0.0.1","port":0}]}}`
	s := startServer(t, o)
	prefill := func(id string, blocks int) *job {
		prompt := make([]int, blocks*16)
		for i := range prompt {
			prompt[i] = i + 1
		}
		return &job{id: id, prompt: prompt, kv: &vllm.KVTransferParams{RemoteDecoder: &vllm.RemoteDecoder{KVRequestID: id}}}
	}
	long := prefill("long", 64)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s.kvc.store(long)
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 8*blockBytes {
		t.Errorf("a 64-block prefill refused by a 4-block tier allocated %d MiB", got>>20)
	}
	if n := s.kvc.tier.size(); n != 0 {
		t.Fatalf("the tier holds %d entries after a refused prefill", n)
	}
	s.kvc.store(prefill("short", 2))
	if n, stored := s.kvc.tier.size(), s.kvc.stats.Stored.Load(); n != 1 || stored != 2 {
		t.Fatalf("a 2-block prefill: %d entries, %d blocks stored", n, stored)
	}
}

// TestKVLoadFailedAnswer: a KV load that fails under
// kv_load_failure_policy=fail is answered as vLLM ≥ 0.11.1 answers it: a
// 500 InternalServerError in the {"error": {...}} body, or, in a stream,
// 200 and the error as an event before [DONE], after the first chunk a
// chat stream sends. The simulator answered 503 in the flat body of vLLM
// before 0.10.1, a stream included.
func TestKVLoadFailedAnswer(t *testing.T) {
	dir := t.TempDir()
	pre := sharedStorageServer(t, dir, RolePrefill, PolicyFail)
	dec := sharedStorageServer(t, dir, RoleDecode, PolicyFail)
	prompt := strings.Repeat("A failed KV load is vLLM's internal server error. ", 10)
	completion := map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 2}
	chat := map[string]any{"model": "Qwen/Qwen3-0.6B", "messages": []map[string]string{{"role": "user", "content": prompt}}, "max_tokens": 2}
	complete(t, pre, "/v1/completions", completion)
	complete(t, pre, "/v1/chat/completions", chat)
	files, _ := filepath.Glob(filepath.Join(dir, "*.kv"))
	for _, f := range files {
		if err := os.WriteFile(f, make([]byte, 16*connectorKVBytes), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	withStream := func(body map[string]any) map[string]any {
		out := map[string]any{"stream": true}
		for k, v := range body {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		path   string
		body   map[string]any
		status int
		before int // stream events before the error
	}{
		{"completion", "/v1/completions", completion, http.StatusInternalServerError, -1},
		{"chat", "/v1/chat/completions", chat, http.StatusInternalServerError, -1},
		{"streamed completion", "/v1/completions", withStream(completion), http.StatusOK, 0},
		{"streamed chat", "/v1/chat/completions", withStream(chat), http.StatusOK, 1}, // the role chunk
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, raw := post(t, dec.URL()+tc.path, tc.body)
			errJSON := raw
			if tc.before >= 0 {
				ev := sseEvents(t, raw)
				if len(ev) != tc.before+2 || ev[len(ev)-1] != "[DONE]" {
					t.Fatalf("status %d, events %q: want %d, the error and [DONE]", st, ev, tc.before)
				}
				errJSON = []byte(ev[tc.before])
			}
			e, err := errorBody(errJSON)
			if st != tc.status || err != nil || e.Code != http.StatusInternalServerError || e.Type != "InternalServerError" ||
				!strings.HasPrefix(e.Message, "Internal server error") || !strings.Contains(e.Message, "wrong byte") {
				t.Fatalf("status %d, error %s (%v)", st, errJSON, err)
			}
		})
	}
}
