package prefix

import (
	"context"
	"strings"
	"testing"
	"weak"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestDecisionReleasesHashing: once PreRequest has run, the state the
// cycle keeps until the response ends holds none of the hashing buffers,
// for a prompt hashed from its text or from a token producer's tokens, and
// the decision still recorded the prompt on its target.
func TestDecisionReleasesHashing(t *testing.T) {
	prompt := strings.Repeat("abcdefgh", 4096)
	tokens := make([]int, 4096)
	for i := range tokens {
		tokens[i] = i
	}
	for _, produced := range []bool{false, true} {
		name := "text"
		if produced {
			name = "token producer's tokens"
		}
		t.Run(name, func(t *testing.T) {
			s, err := schedtest.Build[*Scorer](New, `{"blockSize": 64, "autoTune": false}`)
			if err != nil {
				t.Fatal(err)
			}
			eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
			ctx := context.Background()
			cs := scheduling.NewCycleState()
			if produced {
				scheduling.Write(cs, prefixmatch.TokensKey, &tokens)
			}
			req := completion(t, "m", prompt)
			s.Produce(ctx, cs, req, eps)
			st, _ := scheduling.Read(cs, s.key)
			if st.prefix == nil || st.prefix.Blocks != DefaultMaxPrefixBlocks {
				t.Fatalf("no prefix of %d blocks", DefaultMaxPrefixBlocks)
			}
			sample := weak.Make(&st.prefix.Samples[0])
			s.PreRequest(ctx, cs, req, &scheduling.Result{PrimaryProfile: "d", Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: eps[1:]}}})
			if !testutil.Collected(sample) {
				t.Error("the prompt's block sample is reachable after the decision")
			}
			again := scheduling.NewCycleState()
			if produced {
				scheduling.Write(again, prefixmatch.TokensKey, &tokens)
			}
			scores := make([]float64, len(eps))
			s.Produce(ctx, again, req, eps)
			s.Score(ctx, again, req, eps, scores)
			if scores[0] != 0 || scores[1] != 1 {
				t.Fatalf("scores %v after the decision, want [0 1]", scores)
			}
			s.ResponseComplete(ctx, cs, req, &scheduling.Response{})
			cs.Release()
		})
	}
}
