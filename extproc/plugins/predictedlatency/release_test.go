package predictedlatency

import (
	"testing"
	"weak"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestDecisionReturnsArrays: the per-candidate predictions stay whole for
// every PreRequest hook (another plugin's may run after the producer's)
// and go back to the pool when the decision is made, whatever the
// producer's PreRequest made of the result: a target among its
// candidates, one that is not, or none.
func TestDecisionReturnsArrays(t *testing.T) {
	eps := pair()
	other := schedtest.Endpoint("other", endpoints.Metrics{})
	for _, tc := range []struct {
		name      string
		res       *scheduling.Result
		predicted int // predictions reported
	}{
		{"routed to a candidate", routedTo(eps[1]), 1},
		{"routed elsewhere", routedTo(other), 0},
		{"no primary target", &scheduling.Result{PrimaryProfile: "decode", Profiles: map[string]*scheduling.ProfileResult{"decode": {}}}, 0},
		{"no primary profile", &scheduling.Result{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "")
			req := &scheduling.Request{ID: "r", TargetModel: "m", PromptTokens: prompt, Stream: true}
			cs, preds := f.produce(req, eps)
			estimates := weak.Make(&preds.Estimates[0])
			f.p.PreRequest(ctx, cs, req, tc.res)
			if got, ok := scheduling.Read(cs, latency.PredictionsKey); !ok || len(got.Candidates) != len(eps) || len(got.Estimates) < len(eps) {
				t.Fatal("the predictions are gone before the decision is made")
			}
			cs.Decided()
			if got, _ := scheduling.Read(cs, latency.PredictionsKey); len(got.Estimates) != 0 {
				t.Error("the predictions are readable after the decision")
			}
			if !testutil.Collected(estimates) {
				t.Error("the per-candidate arrays are reachable after the decision")
			}
			if len(f.rec.predicted) != tc.predicted {
				t.Errorf("%d predictions reported, want %d", len(f.rec.predicted), tc.predicted)
			}
			cs.Release()
		})
	}
}

// TestReleaseEndsTicket: a request whose state is released without its
// response hooks (a driver that does not report the end) leaves the
// engine twin's queue or calendar with it.
func TestReleaseEndsTicket(t *testing.T) {
	for _, firstToken := range []bool{false, true} {
		t.Run(map[bool]string{false: "queued", true: "decoding"}[firstToken], func(t *testing.T) {
			f := newFixture(t, "")
			eps := pair()
			req := &scheduling.Request{ID: "r", TargetModel: "m", PromptTokens: prompt, Stream: true, MaxTokens: 100}
			cs, _ := f.produce(req, eps)
			f.p.PreRequest(ctx, cs, req, routedTo(eps[0]))
			if firstToken {
				f.p.FirstToken(ctx, cs, req, &scheduling.Response{Endpoint: eps[0], TTFT: ms(10)})
			}
			cs.Decided()
			count := func() (n int) {
				for _, ft := range f.p.Model().Fits() {
					n += ft.Queued + ft.Decoding
				}
				return n
			}
			if got := count(); got != 1 {
				t.Fatalf("twin holds %d entries before the release, want 1", got)
			}
			cs.Release()
			if got := count(); got != 0 {
				t.Fatalf("twin holds %d entries after the release, want 0", got)
			}
		})
	}
}
