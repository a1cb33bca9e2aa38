package approxprefix

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/openai"
)

func completion(t *testing.T, prompt string) *scheduling.Request {
	t.Helper()
	r, err := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":"`+prompt+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	return &scheduling.Request{TargetModel: "m", Body: r}
}

// route produces the match for req, records it on eps[to] and returns the
// blocks each candidate held.
func route(t *testing.T, p *Producer, req *scheduling.Request, eps []*endpoints.Endpoint, to int) (held []float64, blocks int) {
	t.Helper()
	cs := scheduling.NewCycleState()
	p.Produce(context.Background(), cs, req, eps)
	m, ok := p.MatchOf(cs)
	if !ok {
		t.Fatal("no match produced")
	}
	if m.Prediction != nil {
		for i := range eps {
			held = append(held, m.Prediction.HeldBlocks(i))
		}
	}
	p.PreRequest(context.Background(), cs, req, &scheduling.Result{PrimaryProfile: "d",
		Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: []*endpoints.Endpoint{eps[to]}}}})
	return held, m.Blocks
}

func TestProducerMatches(t *testing.T) {
	p, err := schedtest.Build[*Producer](New, `{"autoTune": false, "blockSizeTokens": 64}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, isScorer := any(p).(scheduling.Scorer); isScorer {
		t.Fatal("the producer must not be a scorer: a profile naming it would weigh it")
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	block := strings.Repeat("x", 256) // 64 tokens of 4 bytes
	if held, _ := route(t, p, completion(t, block+block+strings.Repeat("1", 256)), eps, 1); held[0] != 0 || held[1] != 0 {
		t.Fatalf("cold index held %v", held)
	}
	held, blocks := route(t, p, completion(t, block+block+strings.Repeat("2", 256)), eps, 0)
	if blocks != 3 || held[0] != 0 || held[1] != 2 {
		t.Fatalf("held %v of %d blocks, want [0 2] of 3", held, blocks)
	}
}

// Blocks are never smaller than 64 tokens, as in llm-d: with the default
// 16-token blocks, two prompts sharing 200 bytes (50 tokens) share no
// block.
func TestProducerMinimumBlock(t *testing.T) {
	p, err := schedtest.Build[*Producer](New, `{"autoTune": false}`)
	if err != nil {
		t.Fatal(err)
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{})}
	shared := strings.Repeat("y", 200)
	route(t, p, completion(t, shared+strings.Repeat("1", 400)), eps, 0)
	if held, _ := route(t, p, completion(t, shared+strings.Repeat("2", 400)), eps, 0); held[0] != 0 {
		t.Fatalf("a 50-token overlap matched %v blocks", held[0])
	}
}

func TestProducerParams(t *testing.T) {
	for _, tc := range []struct {
		params string
		ok     bool
	}{
		{`{}`, true},
		{`{"maxPrefixTokensToMatch": 0, "maxPrefixBlocksToMatch": 0}`, true},
		{`{"blockSizeTokens": 0}`, false},
		{`{"lruCapacityPerServer": -1}`, false},
		{`{"blockSize": 256}`, true},
		{`{"hashBlockSize": 64}`, false},
	} {
		if _, err := New("", []byte(tc.params), &scheduling.Handle{}); (err == nil) != tc.ok {
			t.Errorf("%s: err = %v", tc.params, err)
		}
	}
}
