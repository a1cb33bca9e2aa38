package passthroughparser

import "testing"

func TestPassthrough(t *testing.T) {
	p, err := New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pp := p.(*Parser)
	if len(pp.Claims()) != 0 {
		t.Fatalf("claims %v: the fallback claims none", pp.Claims())
	}
	for _, body := range []string{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "\x00binary", ""} {
		if r, err := pp.ParseBody("/v1/chat/completions", []byte(body)); r != nil || err != nil {
			t.Errorf("%q: %v %v, want uninterpreted", body, r, err)
		}
	}
	if _, err := New("", []byte(`{"x":1}`), nil); err == nil {
		t.Error("parameters accepted")
	}
}
