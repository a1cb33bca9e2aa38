package attrreporter

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
)

func build(t *testing.T, params string) *Reporter {
	t.Helper()
	p, err := New("", []byte(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Reporter)
}

// GIE's README and integration-test configurations.
func TestReport(t *testing.T) {
	const total = `{"attributes": [{"key": {"namespace": "envoy.lb", "name": "x-gateway-inference-request-cost"},
		"expression": "usage.prompt_tokens + usage.completion_tokens\n", "condition": "has(usage.prompt_tokens) && has(usage.completion_tokens)"}]}`
	const completion = `{"attributes": [{"key": {"name": "cost"}, "expression": "usage.completion_tokens", "condition": "has(usage.completion_tokens)"}]}`
	const cached = `{"attributes": [{"key": {"namespace": "billing", "name": "uncached"}, "expression": "usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens"}]}`
	u := &openai.Usage{PromptTokens: 30, CompletionTokens: 12, CachedTokens: 16}
	tests := []struct {
		name, params string
		usage        *openai.Usage
		want         scheduling.Metadata
	}{
		{"total", total, u, scheduling.Metadata{"envoy.lb": {"x-gateway-inference-request-cost": 42.0}}},
		{"no usage: condition false", total, nil, scheduling.Metadata{}},
		{"default namespace", completion, u, scheduling.Metadata{"envoy.lb": {"cost": 12.0}}},
		{"zero is not reported", completion, &openai.Usage{PromptTokens: 3}, scheduling.Metadata{}},
		{"cached", cached, u, scheduling.Metadata{"billing": {"uncached": 14.0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			md := scheduling.Metadata{}
			build(t, tc.params).ResponseMetadata(context.Background(), nil, &scheduling.Request{}, tc.usage, md)
			if len(md) != len(tc.want) {
				t.Fatalf("metadata %v, want %v", md, tc.want)
			}
			for ns, kv := range tc.want {
				for k, v := range kv {
					if md[ns][k] != v {
						t.Fatalf("metadata %v, want %v", md, tc.want)
					}
				}
			}
		})
	}
	// A field the usage lacks is an evaluation error: nothing reported.
	r := build(t, `{"attributes": [{"key": {"name": "n"}, "expression": "usage.prompt_tokens"}]}`)
	if _, ok, err := r.Value(nil); ok || err == nil {
		t.Errorf("missing field: ok %v, err %v", ok, err)
	}
	r = build(t, `{"attributes": [{"key": {"name": "n"}, "expression": "'text'"}]}`)
	if _, _, err := r.Value(u); err == nil || !strings.Contains(err.Error(), "not a number") {
		t.Errorf("string result: %v", err)
	}
}

func TestParams(t *testing.T) {
	for _, bad := range []string{
		`{}`,
		`{"attributes": []}`,
		`{"attributes": [{"key": {"name": "a"}, "expression": "1"}, {"key": {"name": "b"}, "expression": "2"}]}`,
		`{"attributes": [{"key": {"name": ""}, "expression": "1"}]}`,
		`{"attributes": [{"key": {"name": "a"}, "expression": ""}]}`,
		`{"attributes": [{"key": {"name": "a"}, "expression": "usage.("}]}`,
		`{"attributes": [{"key": {"name": "a"}, "expression": "1", "condition": "&&"}]}`,
		`{"attributes": [{"key": {"name": "a"}, "expression": "1", "unit": "x"}]}`,
	} {
		if _, err := New("", []byte(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
