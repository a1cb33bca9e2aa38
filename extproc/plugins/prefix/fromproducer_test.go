package prefix

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// A scorer naming a producer scores the producer's match, and the length
// term of matchLengthWeight favours long matches.
func TestScorerFromProducer(t *testing.T) {
	producer, err := schedtest.Build[*Scorer](New, `{"blockSize": 8, "autoTune": false}`)
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(name string) (scheduling.Plugin, bool) { return producer, name == "p" }
	ratio, err := New("ratio", []byte(`{"prefixMatchInfoProducerName": "p"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	length, err := New("length", []byte(`{"prefixMatchInfoProducerName": "p", "matchLengthWeight": 0.5, "matchLengthScaleTokens": 8}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []scheduling.Plugin{ratio, length} {
		if err := s.(scheduling.Resolver).Resolve(lookup); err != nil {
			t.Fatal(err)
		}
	}
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	shared := strings.Repeat("abcdefgh", 6)
	route(t, producer, completion(t, "m", shared+"11111111"), eps, 1)

	cs := scheduling.NewCycleState()
	req := completion(t, "m", shared+"2222222233333333")
	producer.Produce(context.Background(), cs, req, eps)
	got := make([]float64, 2)
	ratio.(scheduling.Scorer).Score(context.Background(), cs, req, eps, got)
	schedtest.ExpectScores(t, got, []float64{0, 0.75})
	// b matched 6 blocks of 2 tokens = 12 tokens ≥ the 8-token scale:
	// 0.5·1 + 0.5·0.75.
	length.(scheduling.Scorer).Score(context.Background(), cs, req, eps, got)
	schedtest.ExpectScores(t, got, []float64{0, 0.875})
}

func TestScorerFromProducerErrors(t *testing.T) {
	for params, want := range map[string]string{
		`{"prefixMatchInfoProducerName": "p", "blockSize": 8}`:         "set it on the producer",
		`{"prefixMatchInfoProducerName": "p", "matchLengthWeight": 2}`: "matchLengthWeight",
		`{"matchLengthScaleTokens": -1}`:                               "matchLengthScaleTokens",
	} {
		if _, err := New("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
	s, err := New("", []byte(`{"prefixMatchInfoProducerName": "p"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.(scheduling.Resolver).Resolve(func(string) (scheduling.Plugin, bool) { return nil, false }); err == nil {
		t.Fatal("dangling producer accepted")
	}
}
