package director

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/gateway/wasmhost"
	"github.com/kvgate/kvgate/gateway/wasmhost/wasmtest"
	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
)

// pool is the package's tests' fixed candidate set.
type pool = schedtest.Pool

// world is one picker: endpoints, KV index, plugins and director. The
// body path and the headers path each get their own, built identically,
// so that the approximate index each one grows stays comparable.
type world struct {
	eps     pool
	index   *kvindex.Index
	built   *config.Built
	d       *Director
	scorers []scheduling.Scorer
}

func newWorld(t *testing.T, cfg string, trust bool) *world {
	t.Helper()
	w := &world{index: kvindex.New(kvindex.Config{})}
	for i, q := range []int{2, 0, 5} {
		w.eps = append(w.eps, schedtest.Endpoint(fmt.Sprintf("pod-%d", i), endpoints.Metrics{WaitingQueueSize: q, KVCacheUsage: 0.1 * float64(i), UpdateTime: time.Now()}))
	}
	c, err := config.Parse([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	h := &scheduling.Handle{Rand: &lockedRand{r: rand.New(rand.NewPCG(1, 1))}, Services: map[string]any{precise.ServiceKVIndex: w.index}}
	if w.built, err = config.Build(c, all.Registry(), h, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range w.built.Plugins {
		if s, ok := p.(scheduling.Scorer); ok {
			w.scorers = append(w.scorers, s)
		}
	}
	w.d = New(Options{Pool: w.eps, Scheduler: w.built.Scheduler, TrustFilterHints: trust,
		Hooks: Hooks{PreRequest: w.built.PreRequest, ResponseComplete: w.built.ResponseComplete}})
	return w
}

type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) Float64() float64 { l.mu.Lock(); defer l.mu.Unlock(); return l.r.Float64() }
func (l *lockedRand) IntN(n int) int   { l.mu.Lock(); defer l.mu.Unlock(); return l.r.IntN(n) }

// scores runs every scorer of w on req.
func (w *world) scores(req *server.Request) map[string][]float64 {
	sr := w.d.schedulingRequest(req)
	out := map[string][]float64{}
	for _, s := range w.scorers {
		v := make([]float64, len(w.eps))
		s.Score(context.Background(), scheduling.NewCycleState(), sr, w.eps, v)
		out[s.TypedName().Name] = v
	}
	return out
}

// corpus is a varied set of requests: shared system prompts, multi-turn
// chats, cache salts, token-id prompts, and long prompts whose prefix
// header is sampled rather than dense.
func corpus(vec testutil.HashVector) []struct{ path, body string } {
	var out []struct{ path, body string }
	add := func(path string, v map[string]any) {
		b, _ := json.Marshal(v)
		out = append(out, struct{ path, body string }{path, string(b)})
	}
	systems := []string{vec.Prompt, strings.Repeat("You are a careful assistant. ", 40), strings.Repeat("Answer in French. ", 200)}
	for i := range 24 {
		sys := systems[i%len(systems)]
		switch i % 4 {
		case 0:
			add("/v1/completions", map[string]any{"model": vec.Model, "prompt": sys + fmt.Sprintf(" Question %d?", i), "max_tokens": 8})
		case 1:
			msgs := []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": fmt.Sprintf("turn %d", i)}}
			if i%8 == 5 {
				msgs = append(msgs, map[string]string{"role": "assistant", "content": "ok"}, map[string]string{"role": "user", "content": "and then?"})
			}
			add("/v1/chat/completions", map[string]any{"model": vec.Model, "messages": msgs, "stream": true})
		case 2:
			add("/v1/completions", map[string]any{"model": vec.Model, "prompt": sys, "cache_salt": fmt.Sprintf("tenant-%d", i%3)})
		case 3:
			add("/v1/completions", map[string]any{"model": vec.Model, "prompt": strings.Repeat(sys, 8) + fmt.Sprint(i)})
		}
	}
	add("/v1/completions", map[string]any{"model": vec.Model, "prompt": vec.TokenIDs})
	add("/v1/completions", map[string]any{"model": vec.Model, "prompt": "short"})
	return out
}

// TestHeadersPathDecidesLikeBodyPath runs one corpus through the picker
// twice: with the body (Envoy's FULL_DUPLEX_STREAMED, the compatible path)
// and with only the headers the real wasm filter wrote (request body mode
// NONE, kvgate's fast path). Every scorer must give identical scores and
// the director identical decisions, in both filter modes.
func TestHeadersPathDecidesLikeBodyPath(t *testing.T) {
	vec := testutil.LoadHashVector(t)
	tokDir := testutil.TokenizerDir(t)
	modes := []struct {
		name, plugin, scorer string
		vmConfig             []byte
	}{
		{"approximate", `{"mode":"approximate","blockSize":16}`, `- type: prefix-cache-scorer
  parameters: {blockSizeTokens: 16, autoTune: false}`, nil},
		{"precise", `{"mode":"precise","blockSize":16,"hashSeed":"42"}`, fmt.Sprintf(`- type: precise-prefix-cache-scorer
  parameters: {tokenizer: %q}`, tokDir), wasmtest.PreciseVMConfig(t, tokDir)},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			host, err := wasmhost.New(context.Background(), wasmhost.Config{
				Module: wasmtest.Filter(t), CompilationCache: wasmtest.Cache(t), MaxVMs: 1,
				PluginConfig: []byte(m.plugin), VMConfig: m.vmConfig,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = host.Close(context.Background()) })
			cfg := `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
` + m.scorer + `
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 3}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: ` + strings.Fields(m.scorer)[2] + `, weight: 3}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: max-score-picker}
`
			bodyWorld, hdrWorld := newWorld(t, cfg, false), newWorld(t, cfg, true)
			// The servers' KV events (precise mode): pod-2 holds the vector
			// prompt's first 20 blocks, pod-0 all 25.
			for _, w := range []*world{bodyWorld, hdrWorld} {
				_ = w.index.Add(w.eps[2].Address(), kvindex.TierGPU, vec.BlockHashes[:20])
				_ = w.index.Add(w.eps[0].Address(), kvindex.TierCPU, vec.BlockHashes)
			}
			long := corpus(vec)[11] // 8 × 3.6 KB: beyond the dense 256 blocks in precise mode
			if m.name == "precise" {
				// pod-1 holds 300 blocks of it: the match ends in the
				// sampled region of the prefix header.
				var sc *precise.Scorer
				for _, s := range bodyWorld.scorers {
					if p, ok := s.(*precise.Scorer); ok {
						sc = p
					}
				}
				parsed, _ := openai.Parse(openai.Completions, []byte(long.body))
				tokens, err := sc.Tokens(&scheduling.Request{Body: parsed})
				if err != nil {
					t.Fatal(err)
				}
				hashes := sc.Hashes(tokens, "", "")
				if len(hashes) <= 300 {
					t.Fatalf("long prompt has only %d blocks", len(hashes))
				}
				for _, w := range []*world{bodyWorld, hdrWorld} {
					_ = w.index.Add(w.eps[1].Address(), kvindex.TierGPU, hashes[:300])
				}
			}
			matchedSome, matchedSampled := false, false
			for i, c := range corpus(vec) {
				api, _ := openai.APIFromPath(c.path)
				parsed, err := openai.Parse(api, []byte(c.body))
				if err != nil {
					t.Fatal(err)
				}
				headers := [][2]string{{":method", "POST"}, {":path", c.path}, {"content-type", "application/json"}}
				tagged, _ := wasmtest.Run(t, host, headers, []byte(c.body), 4096)
				hdrMap := map[string]string{}
				for _, kv := range tagged {
					hdrMap[kv[0]] = kv[1]
				}
				if _, err := hints.Decode(wasmtest.Lookup(tagged)); err != nil {
					t.Fatalf("request %d: filter did not tag: %v", i, err)
				}
				id := fmt.Sprint(i)
				bodyReq := &server.Request{ID: id, Path: c.path, API: api, Body: []byte(c.body), Parsed: parsed, Headers: map[string]string{":path": c.path}, ReceivedAt: time.Now()}
				hdrReq := &server.Request{ID: id, Path: c.path, HeaderOnly: true, Headers: hdrMap, ReceivedAt: time.Now()}

				bs, hs := bodyWorld.scores(bodyReq), hdrWorld.scores(hdrReq)
				for name, want := range bs {
					got := hs[name]
					for j := range want {
						if got[j] != want[j] {
							t.Fatalf("request %d (%s): scorer %s: headers path %v, body path %v", i, c.body[:min(60, len(c.body))], name, got, want)
						}
						if want[j] > 0 && name != "queue-scorer" {
							matchedSome = true
							matchedSampled = matchedSampled || (c == long && want[j] > 0.5)
						}
					}
				}
				bd, bx, err1 := bodyWorld.d.HandleRequest(context.Background(), bodyReq)
				hd, hx, err2 := hdrWorld.d.HandleRequest(context.Background(), hdrReq)
				if err1 != nil || err2 != nil {
					t.Fatalf("request %d: %v / %v", i, err1, err2)
				}
				if strings.Join(bd.Endpoints, ",") != strings.Join(hd.Endpoints, ",") {
					t.Fatalf("request %d: headers path chose %v, body path %v", i, hd.Endpoints, bd.Endpoints)
				}
				bx.ResponseDone(context.Background(), server.ResponseSummary{Status: 200, Complete: true})
				hx.ResponseDone(context.Background(), server.ResponseSummary{Status: 200, Complete: true})
			}
			if !matchedSome {
				t.Fatal("no prefix ever matched: the corpus does not exercise the prefix scorer")
			}
			if m.name == "precise" && !matchedSampled {
				t.Fatal("the long prompt's match beyond the dense blocks was not exercised")
			}
		})
	}
}
