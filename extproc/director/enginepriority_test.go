package director

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/openai"
)

// With EnginePriority the decision carries the objective's priority,
// negated into vLLM's order, for chat and completions bodies; a client's
// own body priority is overridden, and nothing changes with the option off.
func TestEnginePriority(t *testing.T) {
	eps := pool{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	for _, tc := range []struct {
		name      string
		on        bool
		api       openai.API
		body      string
		objective string
		want      *int
	}{
		{"off", false, openai.Completions, `{"model":"m","prompt":"p"}`, "online", nil},
		{"online", true, openai.Completions, `{"model":"m","prompt":"p"}`, "online", ptr(-100)},
		{"sheddable", true, openai.ChatCompletions, `{"model":"m","messages":[{"role":"user","content":"p"}]}`, "batch", ptr(1)},
		{"client's own overridden", true, openai.Completions, `{"model":"m","prompt":"p","priority":-1000}`, "batch", ptr(1)},
		{"no objective, no body priority", true, openai.Completions, `{"model":"m","prompt":"p"}`, "", nil},
		{"no objective, a body priority", true, openai.Completions, `{"model":"m","prompt":"p","priority":-5}`, "", ptr(0)},
		{"unknown objective", true, openai.Completions, `{"model":"m","prompt":"p"}`, "nope", nil},
		{"embeddings untouched", true, openai.Embeddings, `{"model":"m","input":"p"}`, "online", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := liveDirector(t, eps, time.Now)
			d.opts.Objectives = objectives{"online": 100, "batch": -1}
			d.opts.EnginePriority = tc.on
			parsed, err := openai.Parse(tc.api, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req := &server.Request{ID: "r", API: tc.api, Headers: map[string]string{}, Parsed: parsed, Objective: tc.objective, ReceivedAt: time.Now()}
			dec, ex, err := d.HandleRequest(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			ex.ResponseDone(context.Background(), server.ResponseSummary{})
			switch {
			case (dec.EnginePriority == nil) != (tc.want == nil):
				t.Fatalf("engine priority %v, want %v", dec.EnginePriority, tc.want)
			case tc.want != nil && *dec.EnginePriority != *tc.want:
				t.Fatalf("engine priority %d, want %d", *dec.EnginePriority, *tc.want)
			}
		})
	}
}

func ptr(v int) *int { return &v }
