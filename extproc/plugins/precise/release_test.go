package precise

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"weak"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestDecisionReleasesHashing: once PreRequest has run, the prompt the
// cycle state keeps until the response ends holds none of the hashing
// buffers (the sample of a 100k-token prompt's 6250 blocks), with and
// without speculative indexing, whose entries are still withdrawn at the
// response's end.
func TestDecisionReleasesHashing(t *testing.T) {
	ids := make([]string, 100_000)
	tokens := make([]int, len(ids))
	for i := range ids {
		ids[i], tokens[i] = strconv.Itoa(i), i
	}
	body := `{"model":"m","prompt":[` + strings.Join(ids, ",") + `]}`
	for _, tc := range []struct {
		name, params string
		produced     bool // a token producer left the tokens
	}{
		{"token ids", `{"blockSize": 16}`, false},
		{"token producer's tokens", `{"blockSize": 16}`, true},
		{"speculative", `{"blockSize": 16, "speculativeIndexing": true}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, kvindex.New(kvindex.Config{}), tc.params)
			eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
			ctx := context.Background()
			cs := scheduling.NewCycleState()
			if tc.produced {
				scheduling.Write(cs, prefixmatch.TokensKey, &tokens)
			}
			req := completion(t, body)
			s.Produce(ctx, cs, req, eps)
			p, _ := scheduling.Read(cs, s.key)
			if p.prefix == nil || p.prefix.Blocks != len(tokens)/16 {
				t.Fatalf("prefix %+v, want %d blocks", p.prefix, len(tokens)/16)
			}
			sample := weak.Make(&p.prefix.Samples[0])
			res := &scheduling.Result{PrimaryProfile: "d", Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: eps[1:]}}}
			s.PreRequest(ctx, cs, req, res)
			if !testutil.Collected(sample) {
				t.Error("the prompt's block sample is reachable after the decision")
			}
			// The speculative entries stay until the response's end.
			probe := func() float64 {
				return schedtest.Score(s, completion(t, body), eps...)[1]
			}
			if got, want := probe() > 0, s.pending != nil; got != want {
				t.Fatalf("held speculatively after the decision: %v, want %v", got, want)
			}
			s.ResponseComplete(ctx, cs, req, &scheduling.Response{})
			if got := probe(); got != 0 {
				t.Fatalf("score %v after the response's end, want 0", got)
			}
			cs.Release()
		})
	}
}
