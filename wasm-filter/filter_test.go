package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/prefixhash"
)

func newHost(t *testing.T, cfg string) proxytest.HostEmulator {
	t.Helper()
	opt := proxytest.NewEmulatorOption().WithVMContext(&vmContext{}).WithPluginConfiguration([]byte(cfg))
	host, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin = %v; logs %v", st, host.GetCriticalLogs())
	}
	return host
}

func get(headers [][2]string, name string) (string, bool) {
	for _, kv := range headers {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

func count(headers [][2]string, prefix string) int {
	n := 0
	for _, kv := range headers {
		if strings.HasPrefix(kv[0], prefix) {
			n++
		}
	}
	return n
}

// send runs one request through the filter, the body in chunks of chunk
// bytes as a host would deliver them, and returns the headers as they leave
// the filter and its last action. It fails the test if the bytes released
// upstream differ from body: the filter must never rewrite it.
func send(t *testing.T, host proxytest.HostEmulator, path string, extra [][2]string, body []byte, chunk int) ([][2]string, types.Action) {
	t.Helper()
	id := host.InitializeHttpContext()
	headers := append([][2]string{{":method", "POST"}, {":path", path}, {":authority", "gw"}}, extra...)
	act := host.CallOnRequestHeaders(id, headers, len(body) == 0)
	var upstream []byte
	for off := 0; off < len(body); off += chunk {
		end := min(off+chunk, len(body))
		act = host.CallOnRequestBody(id, body[off:end], end == len(body))
		if act == types.ActionContinue {
			upstream = append(upstream, host.GetCurrentRequestBody(id)...)
		}
	}
	if !bytes.Equal(upstream, body) {
		t.Fatalf("upstream body %q, want %q", upstream, body)
	}
	out := host.GetCurrentRequestHeaders(id)
	host.CompleteHttpContext(id)
	return out, act
}

const chatBody = `{"model":"qwen","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"` +
	`Tell me everything about prefix caching in vLLM and why block hashes are chained across the prompt."}]}`

func TestTagsChatRequest(t *testing.T) {
	host := newHost(t, `{"mode":"approximate","blockSize":4}`)
	out, act := send(t, host, "/v1/chat/completions", nil, []byte(chatBody), 7)
	if act != types.ActionContinue {
		t.Fatalf("final action %v", act)
	}
	h, err := hints.Decode(func(k string) (string, bool) { return get(out, k) })
	if err != nil {
		t.Fatalf("decode hints from %v: %v", out, err)
	}
	r, err := openai.Parse(openai.ChatCompletions, []byte(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	seed := prefixhash.Seed("qwen", "")
	want := prefixhash.Blocks(prefixhash.Params{BlockChars: 16, MaxBlocks: 256}, seed, r.PromptText())
	if h.Model != "qwen" || !h.Stream || h.MaxTokens != 64 || h.PromptLen != hints.EstimateTokens(len(r.PromptText())) {
		t.Fatalf("hints %+v", h)
	}
	p := h.Prefix
	if p == nil || p.Mode != hints.Approximate || p.BlockSize != 4 || p.Seed != seed || p.Blocks != len(want) {
		t.Fatalf("prefix %+v, want %d blocks", p, len(want))
	}
	for _, s := range p.Samples {
		if want[s.Index] != s.Hash {
			t.Fatalf("block %d hash differs", s.Index)
		}
	}
}

func TestStripsForgedHints(t *testing.T) {
	host := newHost(t, "")
	forged := [][2]string{
		{"x-kvgate-model", "attacker"}, {"x-kvgate-model", "again"},
		{"x-kvgate-prefix", "1;m=a;b=16;s=0;n=0;k=1;h="}, {"x-kvgate-other", "x"},
	}
	for _, tc := range []struct {
		name, path, body string
		wantTagged       bool
	}{
		{"tagged request", "/v1/completions", `{"model":"m","prompt":"hello"}`, true},
		{"malformed body", "/v1/completions", `{"model":`, false},
		{"not openai", "/healthz", `{}`, false},
		{"no body", "/v1/completions", ``, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := send(t, host, tc.path, forged, []byte(tc.body), 1<<20)
			if v, _ := get(out, "x-kvgate-model"); v == "attacker" || v == "again" {
				t.Fatalf("forged model survived: %v", out)
			}
			if _, ok := get(out, "x-kvgate-other"); ok {
				t.Fatalf("forged header survived: %v", out)
			}
			n := count(out, hints.HeaderPrefix)
			if tc.wantTagged != (n > 0) {
				t.Fatalf("tagged=%v, want %v: %v", n > 0, tc.wantTagged, out)
			}
		})
	}
}

func TestUntagged(t *testing.T) {
	host := newHost(t, `{"maxBodyBytes":64}`)
	big := `{"model":"m","prompt":"` + strings.Repeat("x", 100) + `"}`
	for _, tc := range []struct {
		name  string
		body  string
		extra [][2]string
		chunk int
	}{
		{"invalid json", `not json`, nil, 3},
		{"missing model", `{"prompt":"hi"}`, nil, 3},
		{"over limit, streamed", big, nil, 10},
		{"over limit, content-length", big, [][2]string{{"content-length", "125"}}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, act := send(t, host, "/v1/completions", tc.extra, []byte(tc.body), tc.chunk)
			if act != types.ActionContinue {
				t.Fatalf("request held: %v", act)
			}
			if n := count(out, hints.HeaderPrefix); n != 0 {
				t.Fatalf("tagged: %v", out)
			}
		})
	}
}

// TestBoundedBuffering checks the filter stops holding the body as soon as
// it exceeds maxBodyBytes, so the host's buffer stays bounded too.
func TestBoundedBuffering(t *testing.T) {
	host := newHost(t, `{"maxBodyBytes":100}`)
	id := host.InitializeHttpContext()
	if act := host.CallOnRequestHeaders(id, [][2]string{{":path", "/v1/completions"}}, false); act != types.ActionPause {
		t.Fatalf("headers: %v", act)
	}
	chunk := bytes.Repeat([]byte("a"), 40)
	for i, want := range []types.Action{types.ActionPause, types.ActionPause, types.ActionContinue, types.ActionContinue} {
		if act := host.CallOnRequestBody(id, chunk, false); act != want {
			t.Fatalf("chunk %d: action %v, want %v", i, act, want)
		}
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg     string
		wantErr error
	}{
		{``, nil},
		{`{"mode":"approximate","blockSize":16,"maxPrefixBlocks":256,"maxBodyBytes":1048576,"denseBlocks":64}`, nil},
		{`{"mode":"fuzzy"}`, errAny},
		{`{"blockSize":0}`, errAny},
		{`{"maxPrefixBlocks":-1}`, errAny},
		{`{"maxBodyBytes":0}`, errAny},
		{`{"denseBlocks":5000}`, errAny},
		{`{"blockSizes":16}`, errAny},
		{`[1]`, errAny},
	} {
		c, err := parseConfig([]byte(tc.cfg))
		if (err != nil) != (tc.wantErr != nil) {
			t.Errorf("parseConfig(%s) = %+v, %v", tc.cfg, c, err)
		}
	}
	// precise needs the tokenizer from the VM configuration.
	c := defaultConfig()
	c.mode = hints.Precise
	if _, err := newHasher(c, nil); !errors.Is(err, errModeUnavailable) {
		t.Errorf("precise: %v", err)
	}
}

var errAny = errors.New("any error")

func TestPluginStartFailsOnBadConfig(t *testing.T) {
	opt := proxytest.NewEmulatorOption().WithVMContext(&vmContext{}).WithPluginConfiguration([]byte(`{"mode":"nope"}`))
	host, reset := proxytest.NewHostEmulator(opt)
	defer reset()
	if st := host.StartPlugin(); st != types.OnPluginStartStatusFailed {
		t.Fatalf("StartPlugin = %v", st)
	}
}

func FuzzTag(f *testing.F) {
	f.Add(`/v1/chat/completions`, []byte(chatBody))
	f.Add(`/v1/completions`, []byte(`{"model":"m","prompt":[1,2,3]}`))
	f.Add(`/v1/responses`, []byte(`{"model":"m","input":[{"type":"text","text":"hi"}]}`))
	h := approximate{params: prefixhash.Params{BlockChars: 8, MaxBlocks: 64}, blockSize: 2, dense: 8}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		api, ok := openai.APIFromPath(path)
		if !ok {
			return
		}
		hs, err := tag(h, api, body)
		if err != nil {
			return
		}
		m := map[string]string{}
		hs.Encode(func(k, v string) { m[k] = v })
		if _, err := hints.Decode(func(k string) (string, bool) { v, ok := m[k]; return v, ok }); err != nil {
			t.Fatalf("filter wrote hints the picker cannot read: %v", err)
		}
	})
}
