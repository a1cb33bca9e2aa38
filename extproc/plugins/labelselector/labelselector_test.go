package labelselector

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func pool() []*endpoints.Endpoint {
	return []*endpoints.Endpoint{
		schedtest.Endpoint("d-h100", endpoints.Metrics{}, "llm-d.ai/role", "decode", "hw", "H100"),
		schedtest.Endpoint("d-h200", endpoints.Metrics{}, "llm-d.ai/role", "decode", "hw", "H200"),
		schedtest.Endpoint("p-h100", endpoints.Metrics{}, "llm-d.ai/role", "prefill", "hw", "H100"),
		schedtest.Endpoint("plain", endpoints.Metrics{}),
	}
}

func TestLabelSelectorFilter(t *testing.T) {
	tests := []struct {
		params string
		want   []string
	}{
		{`{"matchLabels": {"llm-d.ai/role": "decode", "hw": "H100"}}`, []string{"d-h100"}},
		{`{"matchExpressions": [{"key": "llm-d.ai/role", "operator": "In", "values": ["decode", "prefill"]}]}`, []string{"d-h100", "d-h200", "p-h100"}},
		{`{"matchExpressions": [{"key": "hw", "operator": "NotIn", "values": ["H100"]}]}`, []string{"d-h200", "plain"}},
		{`{"matchExpressions": [{"key": "hw", "operator": "DoesNotExist"}]}`, []string{"plain"}},
		{`{"matchLabels": {"hw": "H200"}, "matchExpressions": [{"key": "llm-d.ai/role", "operator": "Exists"}]}`, []string{"d-h200"}},
		{`{}`, []string{"d-h100", "d-h200", "p-h100", "plain"}},
	}
	for _, tc := range tests {
		f, err := schedtest.Build[*Filter](New, tc.params)
		if err != nil {
			t.Fatal(err)
		}
		got := schedtest.Names(f.Filter(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, pool()))
		if len(got) != len(tc.want) {
			t.Fatalf("%s: kept %v, want %v", tc.params, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%s: kept %v, want %v", tc.params, got, tc.want)
			}
		}
	}
	for _, bad := range []string{`{"matchExpressions": [{"key": "a", "operator": "Near"}]}`, `{"matchExpressions": [{"key": "a", "operator": "In"}]}`, `{"selector": {}}`} {
		if _, err := New("", []byte(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestByLabel(t *testing.T) {
	for params, want := range map[string]int{
		`{"label": "hw", "validValues": ["H100"]}`:                        2,
		`{"label": "hw", "validValues": ["H100"], "allowsNoLabel": true}`: 3,
		`{"label": "hw", "allowsNoLabel": true}`:                          1,
	} {
		f, err := schedtest.Build[*ByLabel](NewByLabel, params)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Filter(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, pool()); len(got) != want {
			t.Errorf("%s: kept %v, want %d", params, schedtest.Names(got), want)
		}
	}
	for _, bad := range []string{`{}`, `{"label": "hw"}`} {
		if _, err := NewByLabel("", []byte(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
