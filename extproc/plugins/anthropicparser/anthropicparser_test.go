package anthropicparser

import (
	"errors"
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
)

func TestParseBody(t *testing.T) {
	p, err := New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ap := p.(*Parser)
	r, err := ap.ParseBody("/v1/messages", []byte(`{"model":"claude","system":"S","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.API != openai.Messages || r.Model != "claude" || r.MaxTokens != 100 || !r.Stream || len(r.Messages) != 2 {
		t.Fatalf("parsed %+v", r)
	}
	if r, err := ap.ParseBody("/v1/messages/count_tokens", []byte(`{"model":"c","messages":[]}`)); r != nil || err != nil {
		t.Fatalf("count_tokens: %v %v, want uninterpreted", r, err)
	}
	for _, bad := range []string{`{"model":"c","messages":[]}`, `[]`, `{"model":"c"}`} {
		if _, err := ap.ParseBody("/v1/messages", []byte(bad)); !errors.Is(err, openai.ErrInvalidRequest) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
