package parsers_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/plugins/anthropicparser"
	"github.com/kvgate/kvgate/extproc/plugins/openaiparser"
	"github.com/kvgate/kvgate/extproc/plugins/passthroughparser"
	"github.com/kvgate/kvgate/extproc/plugins/vllmhttpparser"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

func build(t testing.TB, fs ...scheduling.Factory) []parsers.Parser {
	t.Helper()
	var out []parsers.Parser
	for _, f := range fs {
		p, err := f("", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p.(parsers.Parser))
	}
	return out
}

const (
	chat     = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	messages = `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	generate = `{"token_ids":[1,2,3]}`
)

// Paths resolve by the longest claimed suffix, to the fallback, or to a
// refusal, as llm-d's parser registry does.
func TestResolve(t *testing.T) {
	tests := []struct {
		name    string
		set     []scheduling.Factory
		path    string
		body    string
		api     openai.API // "" with parsed false: routed uninterpreted
		parsed  bool
		refused bool
	}{
		{name: "chat", set: []scheduling.Factory{openaiparser.New}, path: "/v1/chat/completions?x=1", body: chat, api: openai.ChatCompletions, parsed: true},
		{name: "completions", set: []scheduling.Factory{openaiparser.New}, path: "/v1/completions/", body: `{"model":"m","prompt":"p"}`, api: openai.Completions, parsed: true},
		{name: "render", set: []scheduling.Factory{openaiparser.New}, path: "/v1/chat/completions/render", body: chat, api: openai.ChatCompletions, parsed: true},
		{name: "images", set: []scheduling.Factory{openaiparser.New}, path: "/v1/images/generations", body: `not json`},
		{name: "explicit list, no fallback", set: []scheduling.Factory{openaiparser.New}, path: "/v1/messages", body: messages, refused: true},
		{name: "anthropic", set: []scheduling.Factory{openaiparser.New, anthropicparser.New}, path: "/v1/messages", body: messages, api: openai.Messages, parsed: true},
		{name: "count tokens", set: []scheduling.Factory{anthropicparser.New}, path: "/v1/messages/count_tokens", body: `{}`},
		{name: "generate", set: []scheduling.Factory{vllmhttpparser.New, openaiparser.New}, path: "/inference/v1/generate", body: generate, api: openai.Generate, parsed: true},
		{name: "fallback", set: []scheduling.Factory{openaiparser.New, passthroughparser.New}, path: "/v1/models", body: `anything`},
		{name: "passthrough only", set: []scheduling.Factory{passthroughparser.New}, path: "/v1/chat/completions", body: chat},
		{name: "invalid body", set: []scheduling.Factory{openaiparser.New, passthroughparser.New}, path: "/v1/chat/completions", body: `{"messages":[]}`, refused: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parsers.NewSet(build(t, tc.set...))
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.Parse(tc.path, []byte(tc.body))
			switch {
			case tc.refused:
				if !errors.Is(err, openai.ErrInvalidRequest) {
					t.Fatalf("err = %v, want a refusal", err)
				}
			case err != nil:
				t.Fatal(err)
			case tc.parsed != (r != nil):
				t.Fatalf("parsed %+v, want parsed %v", r, tc.parsed)
			case r != nil && r.API != tc.api:
				t.Fatalf("API %q, want %q", r.API, tc.api)
			}
		})
	}
}

func TestNewSetRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		fs   []scheduling.Factory
		want string
	}{
		"after fallback": {[]scheduling.Factory{passthroughparser.New, openaiparser.New}, "must be last"},
		"same type":      {[]scheduling.Factory{openaiparser.New, openaiparser.New}, "second parser"},
		"none":           {nil, "no request parser"},
	} {
		if _, err := parsers.NewSet(build(t, tc.fs...)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// A conversation routed through the Anthropic or the OpenAI chat parser
// has one prompt text: prefix hashes match across the APIs.
func TestPromptAcrossAPIs(t *testing.T) {
	s, err := parsers.NewSet(build(t, openaiparser.New, anthropicparser.New))
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Parse("/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Parse("/v1/messages", []byte(`{"model":"m","system":"S","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if a.PromptText() != b.PromptText() {
		t.Fatalf("%q != %q", a.PromptText(), b.PromptText())
	}
}

// FuzzSetParse: llm-d's default parsers, any path and body: the routing
// view or a refusal that wraps openai.ErrInvalidRequest (answered 400),
// never a panic; a parsed request's prompt text can be taken, and its API
// is named in the path (render paths end past it).
func FuzzSetParse(f *testing.F) {
	for _, seed := range []struct{ path, body string }{
		{"/v1/chat/completions", chat},
		{"/v1/completions?stream=1", `{"model":"m","prompt":["a","b"]}`},
		{"/v1/messages", messages},
		{"/v1/messages/count_tokens", `{}`},
		{"/inference/v1/generate", generate},
		{"/v1/responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}]}`},
		{"/v1/embeddings", `{"model":"m","input":[[1,2],[3]]}`},
		{"/v1/chat/completions/render", chat},
		{"/v1/models", `not json`},
		{"", ""},
	} {
		f.Add(seed.path, []byte(seed.body))
	}
	set, err := parsers.NewSet(build(f, openaiparser.New, anthropicparser.New, vllmhttpparser.New, passthroughparser.New))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		r, err := set.Parse(path, body)
		if err != nil {
			if !errors.Is(err, openai.ErrInvalidRequest) {
				t.Fatalf("Parse(%q, %q): %v does not wrap ErrInvalidRequest", path, body, err)
			}
			return
		}
		if r == nil {
			return
		}
		_ = r.PromptText()
		if !strings.Contains(parsers.Clean(path), string(r.API)) {
			t.Fatalf("Parse(%q) parsed as %q", path, r.API)
		}
	})
}
