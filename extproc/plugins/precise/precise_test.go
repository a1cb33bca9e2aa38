package precise

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
)

func build(t testing.TB, idx *kvindex.Index, params string) *Scorer {
	t.Helper()
	h := &scheduling.Handle{Services: WithKVIndex(nil, idx)}
	p, err := New("", json.RawMessage(params), h)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Scorer)
}

func completion(t testing.TB, body string) *scheduling.Request {
	t.Helper()
	r, err := openai.Parse(openai.Completions, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return &scheduling.Request{TargetModel: r.Model, Body: r}
}

// The test vector's prompt, tokenized and hashed by the scorer, gives
// exactly the hashes real vLLM published, so an index fed by vLLM's events
// finds them.
func TestVectorPromptMatchesVLLMHashes(t *testing.T) {
	v := testutil.LoadHashVector(t)
	dir := testutil.TokenizerDir(t)
	idx := kvindex.New(kvindex.Config{})
	s := build(t, idx, fmt.Sprintf(`{"tokenizer": %q, "blockSize": 16, "hashSeed": "42"}`, dir))
	body, _ := json.Marshal(map[string]any{"model": v.Model, "prompt": v.Prompt})
	req := completion(t, string(body))
	tokens, err := s.Tokens(req)
	if err != nil {
		t.Fatal(err)
	}
	got := s.Hashes(tokens, "", "")
	if len(got) < len(v.BlockHashes) {
		t.Fatalf("%d hashes, vector has %d", len(got), len(v.BlockHashes))
	}
	for i, want := range v.BlockHashes {
		if got[i] != want {
			t.Fatalf("block %d: %d, want %d", i, got[i], want)
		}
	}

	a := schedtest.Endpoint("a", endpoints.Metrics{})
	b := schedtest.Endpoint("bb", endpoints.Metrics{})
	if err := idx.Add(b.Address(), kvindex.TierGPU, v.BlockHashes[:20]); err != nil {
		t.Fatal(err)
	}
	scores := schedtest.Score(s, req, a, b)
	if scores[0] != 0 || scores[1] != 20/float64(len(got)) {
		t.Fatalf("scores %v, want [0 %v]", scores, 20/float64(len(got)))
	}
}

func TestScoring(t *testing.T) {
	idx := kvindex.New(kvindex.Config{})
	s := build(t, idx, `{"blockSize": 4, "hashSeed": "7"}`)
	req := completion(t, `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`)
	full := s.Hashes(req.Body.PromptTokenIDs, "", "")
	if len(full) != 4 {
		t.Fatalf("%d hashes", len(full))
	}
	gpu := schedtest.Endpoint("gpu", endpoints.Metrics{})
	cpu := schedtest.Endpoint("cpu-node", endpoints.Metrics{})
	lora := schedtest.Endpoint("lora-server", endpoints.Metrics{ActiveLoRAs: map[string]struct{}{"adapter": {}}})
	_ = idx.Add(gpu.Address(), kvindex.TierGPU, full[:3])
	_ = idx.Add(cpu.Address(), kvindex.TierCPU, full)
	tests := []struct {
		name string
		req  *scheduling.Request
		eps  []*endpoints.Endpoint
		want []float64
	}{
		{"gpu and cpu tiers", req, []*endpoints.Endpoint{gpu, cpu}, []float64{0.75, 0.8}},
		{"cache salt changes every block", completion(t, `{"model":"m","cache_salt":"s","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`), []*endpoints.Endpoint{gpu, cpu}, []float64{0, 0}},
		{"an adapter hashes differently", completion(t, `{"model":"adapter","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`), []*endpoints.Endpoint{gpu, lora}, []float64{0, 0}},
		{"prompt shorter than a block", completion(t, `{"model":"m","prompt":[1,2,3]}`), []*endpoints.Endpoint{gpu}, []float64{0}},
		{"no tokenizer for a text prompt", completion(t, `{"model":"m","prompt":"text"}`), []*endpoints.Endpoint{gpu}, []float64{0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			schedtest.ExpectScores(t, schedtest.Score(s, tc.req, tc.eps...), tc.want)
		})
	}
	// Adapter blocks are keyed by the adapter name: an index holding them
	// matches only adapter requests.
	adapterReq := completion(t, `{"model":"adapter","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`)
	_ = idx.Add(lora.Address(), kvindex.TierGPU, s.Hashes(adapterReq.Body.PromptTokenIDs, "adapter", ""))
	if got := schedtest.Score(s, adapterReq, gpu, lora); got[1] != 1 {
		t.Fatalf("adapter request scores %v", got)
	}
}

func TestParams(t *testing.T) {
	idx := kvindex.New(kvindex.Config{})
	for _, params := range []string{`{"hashAlgo": "sha256"}`, `{"blockSize": 0}`, `{"tokenizer": "/nonexistent"}`, `{"blockTokens": 16}`, `{"maxBlocksToMatch": -1}`} {
		if _, err := New("", json.RawMessage(params), &scheduling.Handle{Services: WithKVIndex(nil, idx)}); err == nil {
			t.Errorf("%s accepted", params)
		}
	}
	if _, err := New("", nil, &scheduling.Handle{}); err == nil {
		t.Error("built without a KV index")
	}
}

// BenchmarkTokenizeAndHash6k is the scorer's per-request CPU for a
// 6k-token prompt whose long shared prefix was seen before: prefix-cached
// tokenization plus vLLM block hashing (the target is < 200 µs).
func BenchmarkTokenizeAndHash6k(b *testing.B) {
	v := testutil.LoadHashVector(b)
	s := build(b, kvindex.New(kvindex.Config{}), fmt.Sprintf(`{"tokenizer": %q}`, testutil.TokenizerDir(b)))
	var shared strings.Builder
	for shared.Len() < 30_000 {
		shared.WriteString(v.Prompt)
	}
	reqs := make([]*scheduling.Request, 64)
	for i := range reqs {
		body, _ := json.Marshal(map[string]any{"model": v.Model, "prompt": shared.String() + fmt.Sprintf(" Question %d: what does block %d hold?", i, i)})
		reqs[i] = completion(b, string(body))
	}
	tokens, err := s.Tokens(reqs[0]) // warms the prefix cache
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		toks, err := s.Tokens(reqs[i%len(reqs)])
		if err != nil {
			b.Fatal(err)
		}
		_ = s.Hashes(toks, "", "")
	}
	b.ReportMetric(float64(len(tokens)), "prompt-tokens")
}

// TestHugePromptTokenizedUpToTheHashedBlocks (Medium): a prompt far longer
// than the blocks the scorer can match is tokenized only as far as those
// blocks, and hashes as the whole prompt would.
func TestHugePromptTokenizedUpToTheHashedBlocks(t *testing.T) {
	dir := testutil.TokenizerDir(t)
	s := build(t, kvindex.New(kvindex.Config{}), fmt.Sprintf(`{"tokenizer": %q, "blockSize": 16, "maxBlocksToMatch": 64}`, dir))
	var b strings.Builder
	for i := 0; b.Len() < 1<<20; i++ {
		fmt.Fprintf(&b, "line %d of a very long document that no model's context could hold.\n", i)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": b.String()})
	req := completion(t, string(body))
	tokens, err := s.Tokens(req)
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) != 64*16 {
		t.Fatalf("%d tokens, want the %d the hashes use", len(tokens), 64*16)
	}
	short, _ := json.Marshal(map[string]any{"model": "m", "prompt": b.String()[:20_000]})
	want, err := s.Tokens(completion(t, string(short)))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Hashes(tokens, "", ""), s.Hashes(want, "", "")) {
		t.Fatal("the capped prompt hashes differently from its prefix")
	}
}
