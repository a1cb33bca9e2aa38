package server

import (
	"encoding/json"
	"testing"

	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/plugins/anthropicparser"
	"github.com/kvgate/kvgate/extproc/plugins/openaiparser"
	"github.com/kvgate/kvgate/extproc/plugins/passthroughparser"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/openai"
)

func parserSet(t *testing.T, fs ...scheduling.Factory) *parsers.Set {
	t.Helper()
	var ps []parsers.Parser
	for _, f := range fs {
		p, err := f("", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p.(parsers.Parser))
	}
	s, err := parsers.NewSet(ps)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The configured parsers decide how a body is read: an Anthropic body is
// parsed (and its model rewritten), an unclaimed path is refused, and with
// passthrough alone nothing is interpreted.
func TestConfiguredParsers(t *testing.T) {
	const messages = `{"model":"claude","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	t.Run("anthropic", func(t *testing.T) {
		d := newTestDirector()
		d.decide = func(*Request) (*Decision, error) {
			return &Decision{Endpoints: []string{"10.0.0.1:8000"}, TargetModel: "claude-lora"}, nil
		}
		e := envoytest.Open(t, startServer(t, New(d, Options{Parser: parserSet(t, openaiparser.New, anthropicparser.New)})))
		e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/messages"))
		e.Send(envoytest.RequestBody([]byte(messages), true))
		envoytest.SetHeaders(t, e.Recv())
		var got map[string]any
		if err := json.Unmarshal(envoytest.StreamedChunk(t, e.Recv().GetRequestBody()).GetBody(), &got); err != nil {
			t.Fatal(err)
		}
		if got["model"] != "claude-lora" {
			t.Errorf("body sent %v", got)
		}
		if req := d.request(t); req.API != openai.Messages || req.Parsed == nil || req.Parsed.MaxTokens != 16 {
			t.Errorf("request = %+v", req)
		}
	})
	t.Run("unclaimed", func(t *testing.T) {
		e := envoytest.Open(t, startServer(t, New(newTestDirector("10.0.0.1:8000"), Options{Parser: parserSet(t, openaiparser.New)})))
		e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/messages"))
		e.Send(envoytest.RequestBody([]byte(messages), true))
		envoytest.ImmediateError(t, e.Recv(), 400, inferr.BadRequest)
	})
	t.Run("passthrough", func(t *testing.T) {
		d := newTestDirector("10.0.0.1:8000")
		e := envoytest.Open(t, startServer(t, New(d, Options{Parser: parserSet(t, passthroughparser.New)})))
		e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/chat/completions"))
		e.Send(envoytest.RequestBody([]byte(`{"not":"openai"}`), true))
		envoytest.SetHeaders(t, e.Recv())
		if string(envoytest.StreamedChunk(t, e.Recv().GetRequestBody()).GetBody()) != `{"not":"openai"}` {
			t.Error("body not re-sent as is")
		}
		if req := d.request(t); req.Parsed != nil || req.API != "" {
			t.Errorf("request = %+v", req)
		}
	})
}
