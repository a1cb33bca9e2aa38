package plugins_test

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/kvcacheutil"
	"github.com/kvgate/kvgate/extproc/plugins/loadaware"
	"github.com/kvgate/kvgate/extproc/plugins/loraaffinity"
	"github.com/kvgate/kvgate/extproc/plugins/queue"
	"github.com/kvgate/kvgate/extproc/plugins/runningrequests"
	"github.com/kvgate/kvgate/extproc/plugins/tokenload"
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

// TestScorers checks each load scorer's formula (REFERENCE §2) on a small
// fleet, table-driven.
func TestScorers(t *testing.T) {
	inflight := func(name string, reqs, toks int64) *endpoints.Endpoint {
		e := schedtest.Endpoint(name, endpoints.Metrics{})
		e.AddInflight(reqs, toks)
		return e
	}
	tests := []struct {
		name    string
		factory scheduling.Factory
		params  string
		req     scheduling.Request
		eps     []*endpoints.Endpoint
		want    []float64
	}{
		{
			name: "queue min-max", factory: queue.New,
			eps: []*endpoints.Endpoint{
				schedtest.Endpoint("a", endpoints.Metrics{WaitingQueueSize: 0}),
				schedtest.Endpoint("b", endpoints.Metrics{WaitingQueueSize: 5}),
				schedtest.Endpoint("c", endpoints.Metrics{WaitingQueueSize: 10}),
			},
			want: []float64{1, 0.5, 0},
		},
		{
			name: "queue all equal", factory: queue.New,
			eps: []*endpoints.Endpoint{
				schedtest.Endpoint("a", endpoints.Metrics{WaitingQueueSize: 3}),
				schedtest.Endpoint("b", endpoints.Metrics{WaitingQueueSize: 3}),
			},
			want: []float64{1, 1},
		},
		{
			name: "kv utilization", factory: kvcacheutil.New,
			eps: []*endpoints.Endpoint{
				schedtest.Endpoint("a", endpoints.Metrics{KVCacheUsage: 0.25}),
				schedtest.Endpoint("b", endpoints.Metrics{KVCacheUsage: 1}),
			},
			want: []float64{0.75, 0},
		},
		{
			name: "running requests from picker in-flight", factory: runningrequests.New,
			eps:  []*endpoints.Endpoint{inflight("a", 2, 0), inflight("b", 6, 0), inflight("c", 4, 0)},
			want: []float64{1, 0, 0.5},
		},
		{
			name: "token load default capacity", factory: tokenload.New,
			eps:  []*endpoints.Endpoint{inflight("a", 1, 0), inflight("b", 1, 2_097_152), inflight("c", 1, 9_000_000)},
			want: []float64{1, 0.5, 0},
		},
		{
			name: "token load custom capacity", factory: tokenload.New, params: `{"capacityTokens": 1000}`,
			eps:  []*endpoints.Endpoint{inflight("a", 1, 250)},
			want: []float64{0.75},
		},
		{
			name: "load aware", factory: loadaware.New,
			eps: []*endpoints.Endpoint{
				schedtest.Endpoint("a", endpoints.Metrics{WaitingQueueSize: 0}),
				schedtest.Endpoint("b", endpoints.Metrics{WaitingQueueSize: 64}),
				schedtest.Endpoint("c", endpoints.Metrics{WaitingQueueSize: 500}),
			},
			want: []float64{0.5, 0.25, 0},
		},
		{
			name: "load aware threshold", factory: loadaware.New, params: `{"threshold": 10}`,
			eps:  []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{WaitingQueueSize: 5})},
			want: []float64{0.25},
		},
		{
			name: "lora affinity", factory: loraaffinity.New, req: scheduling.Request{TargetModel: "sql-lora"},
			eps: []*endpoints.Endpoint{
				schedtest.Endpoint("active", endpoints.Metrics{ActiveLoRAs: set("sql-lora"), MaxLoRAs: 2}),
				schedtest.Endpoint("room", endpoints.Metrics{ActiveLoRAs: set("other"), MaxLoRAs: 2}),
				schedtest.Endpoint("waiting", endpoints.Metrics{WaitingLoRAs: set("sql-lora"), ActiveLoRAs: set("x", "y"), MaxLoRAs: 2}),
				schedtest.Endpoint("full", endpoints.Metrics{ActiveLoRAs: set("x", "y"), MaxLoRAs: 2}),
			},
			want: []float64{1, 0.8, 0.6, 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := schedtest.Build[scheduling.Scorer](tc.factory, tc.params)
			if err != nil {
				t.Fatal(err)
			}
			got := schedtest.Score(s, &tc.req, tc.eps...)
			for i := range got {
				if math.Abs(got[i]-tc.want[i]) > 1e-9 {
					t.Fatalf("scores = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestScorerParameterErrors(t *testing.T) {
	tests := []struct {
		name    string
		factory scheduling.Factory
		params  string
	}{
		{"unknown field", queue.New, `{"bogus": 1}`},
		{"zero capacity", tokenload.New, `{"capacityTokens": 0}`},
		{"negative threshold", loadaware.New, `{"threshold": -1}`},
		{"wrong type", loadaware.New, `{"threshold": "high"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.factory("x", []byte(tc.params), &scheduling.Handle{}); err == nil {
				t.Fatal("expected a parameter error")
			}
		})
	}
}
