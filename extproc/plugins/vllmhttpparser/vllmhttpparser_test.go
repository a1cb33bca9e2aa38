package vllmhttpparser

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
	vp := p.(*Parser)
	if c := vp.Claims(); len(c) != 1 || c[0] != "inference/v1/generate" {
		t.Fatalf("claims %v", c)
	}
	r, err := vp.ParseBody("/inference/v1/generate", []byte(`{"token_ids":[11,12],"sampling_params":{"max_tokens":4}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.API != openai.Generate || len(r.PromptTokenIDs) != 2 || r.MaxTokens != 4 {
		t.Fatalf("parsed %+v", r)
	}
	if _, err := vp.ParseBody("/inference/v1/generate", []byte(`{"prompt":"text"}`)); !errors.Is(err, openai.ErrInvalidRequest) {
		t.Errorf("no token_ids: %v", err)
	}
}
