package loraaffinity

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func set(names ...string) map[string]struct{} {
	m := map[string]struct{}{}
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}

func TestScore(t *testing.T) {
	s, err := schedtest.Build[scheduling.Scorer](New, "")
	if err != nil {
		t.Fatal(err)
	}
	got := schedtest.Score(s, &scheduling.Request{TargetModel: "sql-lora"},
		schedtest.Endpoint("active", endpoints.Metrics{ActiveLoRAs: set("sql-lora"), MaxLoRAs: 2}),
		schedtest.Endpoint("room", endpoints.Metrics{ActiveLoRAs: set("other"), MaxLoRAs: 2}),
		schedtest.Endpoint("waiting", endpoints.Metrics{WaitingLoRAs: set("sql-lora"), ActiveLoRAs: set("x", "y"), MaxLoRAs: 2}),
		schedtest.Endpoint("full", endpoints.Metrics{ActiveLoRAs: set("x", "y"), MaxLoRAs: 2}),
		schedtest.Endpoint("no-lora", endpoints.Metrics{}),
	)
	schedtest.ExpectScores(t, got, []float64{1, 0.8, 0.6, 0, 0})
}
