package jinja

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// decodeOrdered decodes JSON into template values, keeping object key order
// (which tojson output depends on).
func decodeOrdered(dec *json.Decoder) (Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				d.Set(k.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			out := []Value{}
			for dec.More() {
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := dec.Token()
			return out, err
		}
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i, nil
		}
		return t.Float64()
	}
	return tok, nil
}

type goldenCase struct {
	Template string          `json:"template"`
	Vars     json.RawMessage `json:"vars"`
	Want     string          `json:"want"`
}

// TestGolden renders templates whose expected output Python Jinja2 produced
// with transformers' settings (testdata/gen_golden.py), including the Qwen3
// chat template on several conversations.
func TestGolden(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Qwen3 string       `json:"qwen3"`
		Cases []goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	for i, c := range g.Cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			src := c.Template
			if src == "qwen3" {
				src = g.Qwen3
			}
			dec := json.NewDecoder(bytes.NewReader(c.Vars))
			dec.UseNumber()
			v, err := decodeOrdered(dec)
			if err != nil {
				t.Fatal(err)
			}
			vars := map[string]any{}
			d := v.(*Dict)
			for _, k := range d.keys {
				vars[k] = d.m[k]
			}
			tpl, err := Parse(src)
			if err != nil {
				t.Fatalf("Parse(%q): %v", c.Template, err)
			}
			got, err := tpl.Render(vars)
			if err != nil {
				t.Fatalf("Render(%q): %v", c.Template, err)
			}
			if got != c.Want {
				t.Errorf("template %q\n got %q\nwant %q", c.Template, got, c.Want)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		src    string
		parse  bool // error expected from Parse rather than Render
		raised string
		substr string
	}{
		{src: "{% if x %}", parse: true, substr: "endif"},
		{src: "{{ x", parse: true, substr: "unclosed"},
		{src: "{% for %}", parse: true, substr: "loop variable"},
		{src: "{% call foo() %}{% endcall %}", parse: true, substr: `unsupported tag "call"`},
		{src: "{{ 1 + }}", parse: true, substr: "unexpected"},
		{src: "{{ 'abc }}", parse: true, substr: "unclosed"},
		{src: "{{ " + strings.Repeat("(", 500) + "1" + strings.Repeat(")", 500) + " }}", parse: true, substr: "too deep"},
		{src: "{{ raise_exception('bad role') }}", raised: "bad role"},
		{src: "{{ x|nosuchfilter }}", substr: "unknown filter"},
		{src: "{{ 1 / 0 }}", substr: "division by zero"},
		{src: "{{ undefined_fn() }}", substr: "undefined"},
		{src: "{% for i in range(2000000) %}{% endfor %}", substr: "range longer"},
		{src: "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", substr: "nested deeper"},
		{src: "{% set x.y = 1 %}", substr: "namespace"},
		{src: "{% break %}", substr: "outside a loop"},
	}
	for _, c := range cases {
		tpl, err := Parse(c.src)
		if err == nil && !c.parse {
			_, err = tpl.Render(nil)
		}
		if err == nil {
			t.Errorf("%q: no error", c.src)
			continue
		}
		var se *SyntaxError
		if c.parse != errors.As(err, &se) {
			t.Errorf("%q: error %v, want syntax error = %v", c.src, err, c.parse)
		}
		var re *RaisedError
		if c.raised != "" && (!errors.As(err, &re) || re.Message != c.raised) {
			t.Errorf("%q: error %v, want RaisedError %q", c.src, err, c.raised)
		}
		if !strings.Contains(err.Error(), c.substr) {
			t.Errorf("%q: error %q does not mention %q", c.src, err, c.substr)
		}
	}
}

func FuzzTemplate(f *testing.F) {
	f.Add("{% for m in messages %}{{ m.role }}{% if loop.last %}!{% endif %}{% endfor %}")
	f.Add("{%- set ns = namespace(a=1) -%}{{ ns.a ~ 'x'|upper }}{{ messages[::-1]|tojson }}")
	f.Add("{{ 'a' if b else c }}{# c #}{% macro q(x=1) %}{{ x }}{% endmacro %}{{ q() }}")
	f.Add("{{ messages[0].content.split('</think>')[-1].lstrip('\\n') }}")
	f.Add("{% if x is defined and x is not none %}{{ x|length }}{% elif y %}{% else %}{% endif %}")
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := Parse(src)
		if err != nil {
			return
		}
		vars := map[string]any{
			"messages": []any{map[string]any{"role": "user", "content": "hi</think>x"}},
			"x":        "s",
		}
		_, _ = tpl.Render(vars)
	})
}

// TestHostileInputs must return (error or not) without panicking or
// exhausting memory.
func TestHostileInputs(t *testing.T) {
	for _, src := range []string{
		"{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}{{ ns == ns }}{{ ns|tojson }}",
		"{{ [1,2,3][1:5:9223372036854775807] }}{{ 'abc'[::-9223372036854775807] }}",
		"{{ 'ab' * 9223372036854775807 }}",
		"{{ 'a b c'.split(' ', 9223372036854775807) }}{{ 'a b c'.rsplit(' ', 9223372036854775807) }}{{ 'a b'.split(none, 9223372036854775807) }}",
		"{{ 'x'|indent(-5) }}{{ 'x\ny'|indent(99999999) }}{{ [1]|tojson(indent=-3) }}",
		"{{ range(-9223372036854775807, 9223372036854775807) }}",
		"{{ -9223372036854775807 - 1 // -1 }}{{ 2 ** 200 }}{{ 2 ** -1 }}",
	} {
		tpl, err := Parse(src)
		if err != nil {
			continue
		}
		_, _ = tpl.Render(nil)
	}
}
