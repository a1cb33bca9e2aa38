package preciseproducer

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/endpointnotification"
	"github.com/kvgate/kvgate/extproc/plugins/metricsdatasource"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/openai"
)

// The producer publishes the precise match (here from a token producer's
// tokens of a text prompt, which it cannot tokenize itself) and is no
// scorer.
func TestProducerMatchesTokens(t *testing.T) {
	idx := kvindex.New(kvindex.Config{})
	h := &scheduling.Handle{Services: precise.WithKVIndex(nil, idx)}
	pl, err := New("", []byte(`{"tokenProcessorConfig": {"blockSize": 4, "hashSeed": "7"}}`), h)
	if err != nil {
		t.Fatal(err)
	}
	p := pl.(*Producer)
	if _, isScorer := pl.(scheduling.Scorer); isScorer {
		t.Fatal("the producer must not be a scorer")
	}
	if p.KVEventSources() != (precise.KVEvents{SocketPort: precise.DefaultSocketPort}) {
		t.Fatalf("KV events %+v: llm-d's layout discovers pods on 5557", p.KVEventSources())
	}
	tokens := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	ref, err := precise.New("", []byte(`{"blockSize": 4, "hashSeed": "7"}`), h)
	if err != nil {
		t.Fatal(err)
	}
	a, b := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})
	if err := idx.Add(b.Address(), kvindex.TierGPU, ref.(*precise.Scorer).Hashes(tokens, "", "")[:2]); err != nil {
		t.Fatal(err)
	}
	body, err := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":"some text"}`))
	if err != nil {
		t.Fatal(err)
	}
	req := &scheduling.Request{TargetModel: "m", Body: body}
	cs := scheduling.NewCycleState()
	scheduling.Write(cs, prefixmatch.TokensKey, &tokens)
	p.Produce(context.Background(), cs, req, []*endpoints.Endpoint{a, b})
	m, ok := p.MatchOf(cs)
	if !ok || m.Blocks != 3 || m.Prediction.HeldBlocks(0) != 0 || m.Prediction.HeldBlocks(1) != 2 {
		t.Fatalf("match %+v ok %v", m, ok)
	}
	// Without the tokens the text prompt cannot be matched (no tokenizer).
	cs = scheduling.NewCycleState()
	p.Produce(context.Background(), cs, req, []*endpoints.Endpoint{a, b})
	if m, _ := p.MatchOf(cs); m.Blocks != 0 {
		t.Fatalf("matched without tokens: %+v", m)
	}
}

func TestAcceptsSource(t *testing.T) {
	h := &scheduling.Handle{Services: precise.WithKVIndex(nil, kvindex.New(kvindex.Config{}))}
	pl, err := New("", nil, h)
	if err != nil {
		t.Fatal(err)
	}
	notif, _ := endpointnotification.New("", nil, nil)
	metrics, _ := metricsdatasource.New("", nil, nil)
	if err := pl.(*Producer).AcceptsSource(notif.(scheduling.DataSource)); err != nil {
		t.Fatal(err)
	}
	if err := pl.(*Producer).AcceptsSource(metrics.(scheduling.DataSource)); err == nil {
		t.Fatal("the metrics source accepted")
	}
	if _, err := New("", nil, &scheduling.Handle{}); err == nil {
		t.Fatal("built without a KV index")
	}
}
