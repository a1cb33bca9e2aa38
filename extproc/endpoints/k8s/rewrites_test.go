package k8s

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// rewriteObj decodes as the API client does (integers as int64).
func rewriteObj(t *testing.T, s string) map[string]any {
	t.Helper()
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON([]byte(`{"apiVersion":"llm-d.ai/v1alpha2","kind":"InferenceModelRewrite",` + s[1:])); err != nil {
		t.Fatal(err)
	}
	return u.Object
}

func TestRewriteRules(t *testing.T) {
	const pool = "pool"
	tests := []struct {
		name, obj string
		rules     int
		match     bool
		err       bool
	}{
		{"weighted", `{"metadata":{"name":"a","creationTimestamp":"2026-01-01T00:00:00Z"},"spec":{"poolRef":{"name":"pool"},"rules":[{"matches":[{"model":{"type":"Exact","value":"m"}}],"targets":[{"modelRewrite":"m-v1","weight":90},{"modelRewrite":"m-v2","weight":10}]}]}}`, 1, true, false},
		{"generic", `{"metadata":{"name":"g"},"spec":{"poolRef":{"name":"pool","group":"inference.networking.k8s.io","kind":"InferencePool"},"rules":[{"targets":[{"modelRewrite":"x"}]}]}}`, 1, true, false},
		{"other pool", `{"metadata":{"name":"o"},"spec":{"poolRef":{"name":"other"},"rules":[]}}`, 0, false, false},
		{"no poolRef", `{"metadata":{"name":"o"},"spec":{}}`, 0, false, true},
		{"bad match type", `{"metadata":{"name":"b"},"spec":{"poolRef":{"name":"pool"},"rules":[{"matches":[{"model":{"type":"Regex","value":"m.*"}}],"targets":[{"modelRewrite":"x"}]}]}}`, 0, true, true},
		{"empty target", `{"metadata":{"name":"b"},"spec":{"poolRef":{"name":"pool"},"rules":[{"targets":[{"modelRewrite":""}]}]}}`, 0, true, true},
		{"negative weight", `{"metadata":{"name":"b"},"spec":{"poolRef":{"name":"pool"},"rules":[{"targets":[{"modelRewrite":"x","weight":-1}]}]}}`, 0, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rules, match, err := rewriteRules(rewriteObj(t, tc.obj), pool)
			if (err != nil) != tc.err || match != tc.match || (err == nil && len(rules) != tc.rules) {
				t.Fatalf("rules %d match %v err %v", len(rules), match, err)
			}
		})
	}
}

// The oldest exact rule wins, then the oldest generic one, as in llm-d;
// targets are chosen by weight.
func TestRewriteTable(t *testing.T) {
	var rules []*rewriteRule
	for _, o := range []string{
		`{"metadata":{"name":"new","creationTimestamp":"2026-02-01T00:00:00Z"},"spec":{"poolRef":{"name":"p"},"rules":[{"matches":[{"model":{"value":"m"}}],"targets":[{"modelRewrite":"from-new"}]}]}}`,
		`{"metadata":{"name":"old","creationTimestamp":"2026-01-01T00:00:00Z"},"spec":{"poolRef":{"name":"p"},"rules":[{"matches":[{"model":{"value":"m"}}],"targets":[{"modelRewrite":"from-old"}]}]}}`,
		`{"metadata":{"name":"catch-all","creationTimestamp":"2026-03-01T00:00:00Z"},"spec":{"poolRef":{"name":"p"},"rules":[{"targets":[{"modelRewrite":"a","weight":3},{"modelRewrite":"b","weight":1}]}]}}`,
	} {
		rs, _, err := rewriteRules(rewriteObj(t, o), "p")
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, rs...)
	}
	tb := newRewriteTable(rules)
	if r := tb.rule("m"); r == nil || r.rewrite != "old" {
		t.Fatalf("rule for m = %+v, want the oldest", r)
	}
	r := tb.rule("anything")
	if r == nil || r.rewrite != "catch-all" {
		t.Fatalf("generic rule = %+v", r)
	}
	counts := map[string]int{}
	for i := range 4 {
		counts[pick(r.targets, func(int) int { return i })]++
	}
	if counts["a"] != 3 || counts["b"] != 1 {
		t.Fatalf("weighted picks %v, want a 3 of 4", counts)
	}
	if got := pick([]RewriteTarget{{Model: "x"}, {Model: "y"}}, func(int) int { return 1 }); got != "y" {
		t.Fatalf("unweighted pick %q", got)
	}
	if pick(nil, func(int) int { return 0 }) != "" {
		t.Fatal("a rule without targets picked one")
	}
}
