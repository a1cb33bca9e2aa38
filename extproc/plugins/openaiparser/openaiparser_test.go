package openaiparser

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

func TestNew(t *testing.T) {
	p, err := New("parser", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.(scheduling.RequestParser); !ok || p.TypedName() != (scheduling.TypedName{Type: Type, Name: "parser"}) {
		t.Fatalf("plugin %v", p.TypedName())
	}
	if _, err := New("", []byte(`{"apis": ["chat"]}`), nil); err == nil {
		t.Fatal("parameters accepted")
	}
}

func TestParseBody(t *testing.T) {
	p := &Parser{}
	if !slices.Contains(p.Claims(), "chat/completions") || !slices.Contains(p.Claims(), "conversations") {
		t.Fatalf("claims %v", p.Claims())
	}
	const chat = `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	for path, want := range map[string]openai.API{
		"/v1/chat/completions":        openai.ChatCompletions,
		"/v1/chat/completions/render": openai.ChatCompletions,
		"/v1/completions":             openai.Completions,
		"/v1/completions/render":      openai.Completions,
		"/v1/responses":               openai.Responses,
		"/v1/embeddings":              openai.Embeddings,
		"/v1/conversations":           "",
		"/v1/images/generations":      "",
	} {
		body := chat
		switch want {
		case openai.Completions:
			body = `{"model":"m","prompt":"p"}`
		case openai.Responses, openai.Embeddings:
			body = `{"model":"m","input":"p"}`
		}
		r, err := p.ParseBody(path, []byte(body))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if (want == "") != (r == nil) || (r != nil && r.API != want) {
			t.Errorf("%s: parsed %+v, want API %q", path, r, want)
		}
	}
	if _, err := p.ParseBody("/v1/chat/completions", []byte(`{"model":"m"}`)); !errors.Is(err, openai.ErrInvalidRequest) {
		t.Errorf("invalid chat body: %v", err)
	}
}
