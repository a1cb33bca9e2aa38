package openaiparser

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
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
