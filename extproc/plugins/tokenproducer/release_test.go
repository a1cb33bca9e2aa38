package tokenproducer_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/director"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
)

// tokensSeen is a PreRequest hook run before the configured ones: it keeps
// a weak pointer to the tokens the producer left, so that what keeps them
// alive afterwards is the director's exchange.
type tokensSeen struct {
	scheduling.Named
	tokens weak.Pointer[int]
}

func (o *tokensSeen) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Result) {
	if t, ok := scheduling.Read(cs, prefixmatch.TokensKey); ok && len(*t) > 0 {
		o.tokens = weak.Make(&(*t)[0])
	}
}

// releaseConfig is the token producer feeding the matcher named.
func releaseConfig(matcher string) string {
	return `
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
- type: ` + matcher + `
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: ` + matcher + `
  - pluginRef: max-score-picker
`
}

// TestTokensUnreachableWhileResponseStreams: the prompt's tokens (estimated
// from a long prompt, or the client's own token ids) are unreachable from a
// routed request's exchange while its response streams.
func TestTokensUnreachableWhileResponseStreams(t *testing.T) {
	text := strings.Repeat("lorem ipsum ", 1<<20/12)
	ids := make([]string, 100_000)
	for i := range ids {
		ids[i] = strconv.Itoa(i % 50_000)
	}
	for _, tc := range []struct {
		name, matcher string
		api           openai.API
		body          string
	}{
		{"completion, approximate matcher", "prefix-cache-scorer", openai.Completions, `{"model":"m","stream":true,"max_tokens":10,"prompt":"` + text + `"}`},
		{"chat, approximate matcher", "prefix-cache-scorer", openai.ChatCompletions, `{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"` + text + `"}]}`},
		{"token ids, approximate matcher", "prefix-cache-scorer", openai.Completions, `{"model":"m","stream":true,"max_tokens":10,"prompt":[` + strings.Join(ids, ",") + `]}`},
		{"completion, precise matcher", "precise-prefix-cache-scorer", openai.Completions, `{"model":"m","stream":true,"max_tokens":10,"prompt":"` + text + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(releaseConfig(tc.matcher)))
			if err != nil {
				t.Fatal(err)
			}
			h := &scheduling.Handle{Now: time.Now, Services: precise.WithKVIndex(nil, kvindex.New(kvindex.Config{}))}
			built, err := config.Build(c, all.Registry(), h, nil)
			if err != nil {
				t.Fatal(err)
			}
			seen := &tokensSeen{Named: scheduling.NewNamed("tokens-seen", "tokens-seen")}
			eps := schedtest.Pool{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
			d := director.New(director.Options{Pool: eps, Scheduler: built.Scheduler, Now: time.Now, Hooks: director.Hooks{
				PreRequest: append([]scheduling.PreRequest{seen}, built.PreRequest...), FirstToken: built.FirstToken,
				ResponseComplete: built.ResponseComplete, Hold: built.Hold}})
			ctx := context.Background()
			body := []byte(tc.body)
			parsed, err := openai.Parse(tc.api, body)
			if err != nil {
				t.Fatal(err)
			}
			req := &server.Request{ID: "r", Method: "POST", API: tc.api, Headers: map[string]string{}, Body: body, Parsed: parsed, ReceivedAt: time.Now()}
			dec, ex, err := d.HandleRequest(ctx, req)
			if err != nil || len(dec.Endpoints) == 0 {
				t.Fatalf("decision %v, %v", dec, err)
			}
			if seen.tokens == (weak.Pointer[int]{}) {
				t.Fatal("the producer left no tokens")
			}
			// As the server does once it has sent the body back.
			req.Body, req.Parsed, body, parsed = nil, nil, nil, nil
			ex.ResponseStarted(ctx, server.ResponseHead{Status: 200})
			ex.ResponseChunk(ctx, []byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"))
			if !testutil.Collected(seen.tokens) {
				t.Error("the prompt's tokens are reachable while the response streams")
			}
			ex.ResponseChunk(ctx, []byte("data: [DONE]\n\n"))
			ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Streaming: true, Complete: true})
		})
	}
}
