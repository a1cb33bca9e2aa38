package p2psource

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"weak"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/testutil"
)

// run produces over eps holding held blocks (16 tokens each), then
// PreRequest with res, and returns the header set.
func run(t *testing.T, p *Producer, id string, eps []*endpoints.Endpoint, held []float64, res *scheduling.Result) string {
	t.Helper()
	cs := scheduling.NewCycleState()
	m := &prefixmatch.Prediction{BlockTokens: 16, PromptTokens: 1000, Exact: true}
	m.Reset(eps)
	for i, h := range held {
		m.Matched(i, h)
	}
	prefixmatch.Publish(cs, m)
	req := &scheduling.Request{ID: id, PromptTokens: 1000}
	p.Produce(context.Background(), cs, req, eps)
	m.Done() // the prefix scorer's PreRequest may recycle the match first
	p.PreRequest(context.Background(), cs, req, res)
	return res.Headers[eppwire.HeaderKVCacheSource]
}

func result(primary *endpoints.Endpoint, prefill *endpoints.Endpoint) *scheduling.Result {
	r := &scheduling.Result{PrimaryProfile: "decode", Profiles: map[string]*scheduling.ProfileResult{"decode": {Targets: []*endpoints.Endpoint{primary}}}}
	if prefill != nil {
		r.Profiles["prefill"] = &scheduling.ProfileResult{Targets: []*endpoints.Endpoint{prefill}}
	}
	return r
}

func TestSource(t *testing.T) {
	a, b, c := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{}), schedtest.Endpoint("c", endpoints.Metrics{})
	eps := []*endpoints.Endpoint{a, b, c}
	p, err := schedtest.Build[*Producer](New, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, p, "r", eps, []float64{0, 10, 0}, result(a, nil)); got != b.Address() {
		t.Errorf("source %q, want b", got)
	}
	if got := run(t, p, "r", eps, []float64{10, 10, 0}, result(a, nil)); got != "" {
		t.Errorf("computing server holds as much: source %q", got)
	}
	if got := run(t, p, "r", eps, []float64{0, 10, 0}, result(a, b)); got != "" {
		t.Errorf("the prefill server computes and is the source: %q", got)
	}
	if got := run(t, p, "r", eps, []float64{0, 0, 0}, result(a, nil)); got != "" {
		t.Errorf("nothing cached anywhere: source %q", got)
	}
	big, _ := schedtest.Build[*Producer](New, `{"minCachedTokenDelta": 200}`)
	if got := run(t, big, "r", eps, []float64{0, 10, 0}, result(a, nil)); got != "" {
		t.Errorf("160 tokens under minCachedTokenDelta 200: source %q", got)
	}
	// Within one block of the most, sources share the pulls; one further
	// back never serves.
	seen := map[string]int{}
	for i := range 400 {
		seen[run(t, p, fmt.Sprint("req-", i), eps, []float64{0, 10, 9.5}, result(a, nil))]++
	}
	if seen[b.Address()] < 120 || seen[c.Address()] < 120 || len(seen) != 2 {
		t.Errorf("sources of 400 requests: %v", seen)
	}
	seen = map[string]int{}
	for i := range 100 {
		seen[run(t, p, fmt.Sprint("req-", i), eps, []float64{0, 10, 8}, result(a, nil))]++
	}
	if seen[b.Address()] != 100 {
		t.Errorf("two blocks behind still chosen: %v", seen)
	}
	// A queued source is chosen less often.
	b.Charge(0, 1000, 1000, 1000)
	b.Charge(0, 1000, 1000, 1000)
	b.Charge(0, 1000, 1000, 1000)
	seen = map[string]int{}
	for i := range 400 {
		seen[run(t, p, fmt.Sprint("req-", i), eps, []float64{0, 10, 10}, result(a, nil))]++
	}
	if seen[b.Address()] >= seen[c.Address()]/2 {
		t.Errorf("busy source b chosen %d times, idle c %d", seen[b.Address()], seen[c.Address()])
	}
	for _, bad := range []string{`{"minCachedTokenDelta": 0}`, `{"x": 1}`} {
		if _, err := schedtest.Build[*Producer](New, bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestDecisionDropsState: what every candidate held is unreachable from the
// cycle state once PreRequest has run, whether or not it named a source.
func TestDecisionDropsState(t *testing.T) {
	a, b := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})
	for _, tc := range []struct {
		name string
		res  *scheduling.Result
	}{
		{"source named", result(a, nil)},
		{"on the source", result(b, nil)},
		{"no result", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := schedtest.Build[*Producer](New, "")
			if err != nil {
				t.Fatal(err)
			}
			cs := scheduling.NewCycleState()
			m := &prefixmatch.Prediction{BlockTokens: 16, PromptTokens: 1000, Exact: true}
			m.Reset([]*endpoints.Endpoint{a, b})
			m.Matched(1, 40)
			prefixmatch.Publish(cs, m)
			req := &scheduling.Request{ID: "r", PromptTokens: 1000}
			p.Produce(context.Background(), cs, req, []*endpoints.Endpoint{a, b})
			st, _ := scheduling.Read(cs, p.key)
			held := weak.Make(&st.held[0])
			p.PreRequest(context.Background(), cs, req, tc.res)
			if !testutil.Collected(held) {
				t.Error("the candidates' held tokens are reachable after the decision")
			}
			runtime.KeepAlive(cs)
		})
	}
}
