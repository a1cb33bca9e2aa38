package prefix

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/openai"
)

func completion(t *testing.T, model, prompt string) *scheduling.Request {
	t.Helper()
	body := `{"model":"` + model + `","prompt":"` + prompt + `"}`
	r, err := openai.Parse(openai.Completions, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return &scheduling.Request{TargetModel: model, Body: r}
}

// route scores req, then records it on the best endpoint as the picker
// would, returning the scores.
func route(t *testing.T, s *Scorer, req *scheduling.Request, eps []*endpoints.Endpoint, to int) []float64 {
	t.Helper()
	cs := scheduling.NewCycleState()
	scores := make([]float64, len(eps))
	s.Score(context.Background(), cs, req, eps, scores)
	s.PreRequest(context.Background(), cs, req, &scheduling.Result{
		PrimaryProfile: "default",
		Profiles:       map[string]*scheduling.ProfileResult{"default": {Targets: []*endpoints.Endpoint{eps[to]}}},
	})
	return scores
}

func TestPrefixScoring(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, `{"blockSize": 8, "autoTune": false}`)
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	shared := strings.Repeat("abcdefgh", 6) // 6 blocks
	if got := route(t, s, completion(t, "m", shared+"11111111"), eps, 1); got[0] != 0 || got[1] != 0 {
		t.Fatalf("cold index scored %v", got)
	}
	// Same first 6 blocks, different 7th and 8th: 6 of 8 match on b.
	got := route(t, s, completion(t, "m", shared+"2222222233333333"), eps, 1)
	if got[0] != 0 || got[1] != 6.0/8 {
		t.Fatalf("scores = %v, want [0 0.75]", got)
	}
	// Another model never matches: the seed differs.
	if got := route(t, s, completion(t, "other", shared+"11111111"), eps, 0); got[1] != 0 {
		t.Fatalf("other model matched: %v", got)
	}
	// A prompt shorter than one block has nothing to match.
	if got := route(t, s, completion(t, "m", "short"), eps, 0); got[0] != 0 || got[1] != 0 {
		t.Fatalf("partial block matched: %v", got)
	}
	s.EndpointsRemoved([]string{eps[1].Address()})
	if got := route(t, s, completion(t, "m", shared+"11111111"), eps, 0); got[1] != 0 {
		t.Fatalf("removed endpoint still matches: %v", got)
	}
}

// The per-server LRU evicts the least recently routed blocks first.
func TestPrefixLRUCapacity(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, `{"blockSize": 4, "lruCapacityPerServer": 4, "autoTune": false}`)
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{})}
	route(t, s, completion(t, "m", "aaaabbbb"), eps, 0) // 2 blocks
	route(t, s, completion(t, "m", "ccccdddd"), eps, 0) // 2 more: full
	route(t, s, completion(t, "m", "eeee"), eps, 0)     // evicts aaaa
	if n := s.IndexSize(); n != 4 {
		t.Fatalf("index size %d, want 4", n)
	}
	if got := schedtest.Score(s, completion(t, "m", "aaaabbbb"), eps...); got[0] != 0 {
		t.Fatalf("evicted prefix still matched: %v", got)
	}
	if got := schedtest.Score(s, completion(t, "m", "ccccdddd"), eps...); got[0] != 1 {
		t.Fatalf("recent prefix lost: %v", got)
	}
}

// With autoTune the block size follows the servers' vllm:cache_config_info.
func TestPrefixAutoTune(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, "")
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{BlockSize: 2, NumGPUBlocks: 100})}
	if got := s.blockChars(eps); got != 8 {
		t.Fatalf("block chars %d, want 8", got)
	}
	if got := s.capacity(eps[0]); got != 100 {
		t.Fatalf("capacity %d, want 100", got)
	}
	if _, err := schedtest.Build[*Scorer](New, `{"blockSizeTokens": 16}`); err != nil {
		t.Fatal(err)
	}
	if _, err := schedtest.Build[*Scorer](New, `{"blockSize": 0}`); err == nil {
		t.Fatal("blockSize 0 accepted")
	}
}

// TestAutoTuneBlockSizeNotFromFirst (left open): the auto-tuned block size
// is the one most candidates report, whatever their order, not the first
// candidate's.
func TestAutoTuneBlockSizeNotFromFirst(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, "")
	if err != nil {
		t.Fatal(err)
	}
	ep := func(name string, bs int) *endpoints.Endpoint {
		return schedtest.Endpoint(name, endpoints.Metrics{BlockSize: bs, NumGPUBlocks: 100})
	}
	for _, tc := range []struct {
		name string
		eps  []*endpoints.Endpoint
		want int // tokens
	}{
		{"odd one first", []*endpoints.Endpoint{ep("a", 32), ep("b", 16), ep("c", 16)}, 16},
		{"odd one last", []*endpoints.Endpoint{ep("b", 16), ep("c", 16), ep("a", 32)}, 16},
		{"tie takes the smaller", []*endpoints.Endpoint{ep("a", 32), ep("b", 16)}, 16},
		{"unreported ignored", []*endpoints.Endpoint{ep("a", 0), ep("b", 32)}, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.blockChars(tc.eps); got != tc.want*4 {
				t.Fatalf("block chars %d, want %d", got, tc.want*4)
			}
		})
	}
	if got := s.blockChars([]*endpoints.Endpoint{ep("a", 0)}); got != s.params.BlockSize {
		t.Fatalf("no reported size: %d, want the configured %d", got, s.params.BlockSize)
	}
}

// Chat requests hash the whole conversation, so a follow-up turn extends
// the previous turn's prefix.
func TestPrefixChatConversation(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, `{"blockSize": 4, "autoTune": false}`)
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	chat := func(msgs string) *scheduling.Request {
		r, err := openai.Parse(openai.ChatCompletions, []byte(`{"model":"m","messages":[`+msgs+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		return &scheduling.Request{TargetModel: "m", Body: r}
	}
	turn1 := `{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Tell me about KV caches."}`
	route(t, s, chat(turn1), eps, 1)
	got := route(t, s, chat(turn1+`,{"role":"assistant","content":"They store attention keys."},{"role":"user","content":"More?"}`), eps, 0)
	if got[1] < 0.5 || got[0] != 0 {
		t.Fatalf("second turn scores %v: should match most of the conversation on b", got)
	}
}

// Token-id prompts hash too, so that a shared token prefix matches.
func TestPrefixTokenIDPrompt(t *testing.T) {
	s, err := schedtest.Build[*Scorer](New, `{"blockSizeTokens": 2, "autoTune": false}`)
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{})}
	ids := func(body string) *scheduling.Request {
		r, err := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":`+body+`}`))
		if err != nil {
			t.Fatal(err)
		}
		return &scheduling.Request{TargetModel: "m", Body: r}
	}
	route(t, s, ids("[1,2,3,4,5,6]"), eps, 0)
	if got := schedtest.Score(s, ids("[1,2,3,4,9,9]"), eps...); got[0] != 2.0/3 {
		t.Fatalf("scores %v, want [0.667]", got)
	}
}
