package openai

import "testing"

// With sets several members in one rewrite: replaced where present (every
// duplicate), added first where absent, every other byte kept.
func TestWith(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"model":"a","prompt":"p"}`, `{"priority":-100,"model":"b","prompt":"p"}`},
		{`{"model":"a","prompt":"p","priority":3}`, `{"model":"b","prompt":"p","priority":-100}`},
		{`{"priority": "x", "model":"a","prompt":"p","priority":null}`, `{"priority": -100, "model":"b","prompt":"p","priority":-100}`},
		{`{"prompt":"p"}`, `{"priority":-100,"model":"b","prompt":"p"}`},
	}
	for _, tt := range tests {
		r, err := Parse(Completions, []byte(tt.in))
		if err != nil && tt.in != `{"prompt":"p"}` {
			t.Fatalf("%s: %v", tt.in, err)
		}
		if r == nil {
			r = &Request{API: Generate, body: []byte(tt.in)}
		}
		got, err := r.With(Field{Key: "model", Value: "b"}, Field{Key: "priority", Value: -100})
		if err != nil || string(got) != tt.want {
			t.Errorf("With(%s) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
		if _, err := Parse(Completions, got); err != nil {
			t.Errorf("With(%s) = %s does not parse: %v", tt.in, got, err)
		}
	}
}
