package servedverifier

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestResponseHeader(t *testing.T) {
	p, err := New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for served, want := range map[string]string{"10.0.0.7:8000": "10.0.0.7:8000", "": Missing} {
		res := &scheduling.ResponseHead{Status: 200, Served: served}
		p.(*Verifier).ResponseHeader(context.Background(), nil, &scheduling.Request{}, res)
		if got := res.SetHeaders()[Header]; got != want || len(res.SetHeaders()) != 1 {
			t.Errorf("served %q: headers %v, want %s: %q", served, res.SetHeaders(), Header, want)
		}
	}
	if _, err := New("", []byte(`{"header": "x"}`), nil); err == nil {
		t.Error("parameters accepted")
	}
}
