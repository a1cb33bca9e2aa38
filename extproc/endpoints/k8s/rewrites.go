package k8s

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// rewriteGVKs are InferenceModelRewrite's API versions, llm-d's group first
// (its rewrite wins over a namesake in GIE's group), read as unstructured
// objects like the objectives.
var rewriteGVKs = []schema.GroupVersionKind{
	{Group: "llm-d.ai", Version: "v1alpha2", Kind: "InferenceModelRewrite"},
	{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Kind: "InferenceModelRewrite"},
}

// MaxRewriteRules bounds the rewrite table; further rules are ignored
// (logged).
const MaxRewriteRules = 10000

// RewriteTarget is one weighted target of a rewrite rule.
type RewriteTarget struct {
	Model string
	// Weight is nil when the rule gives none (then, unless every target
	// is unweighted, the target is never chosen, as in llm-d).
	Weight *int32
}

// rewriteRule is one rule with what orders it: its rewrite's creation
// time (the oldest wins) and name.
type rewriteRule struct {
	rewrite string
	created time.Time
	models  []string // exact matches; none means every model
	targets []RewriteTarget
}

// rewriteTable resolves a model to the oldest rule matching it exactly,
// else to the oldest rule without matches, as llm-d's datastore does.
type rewriteTable struct {
	exact   map[string][]*rewriteRule
	generic []*rewriteRule
}

func (t *rewriteTable) rule(model string) *rewriteRule {
	if rs := t.exact[model]; len(rs) > 0 {
		return rs[0]
	}
	if len(t.generic) > 0 {
		return t.generic[0]
	}
	return nil
}

// newRewriteTable orders rules oldest first (by name when created at the
// same second).
func newRewriteTable(rules []*rewriteRule) *rewriteTable {
	older := func(a, b *rewriteRule) int {
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		if a.rewrite < b.rewrite {
			return -1
		}
		if a.rewrite > b.rewrite {
			return 1
		}
		return 0
	}
	t := &rewriteTable{exact: map[string][]*rewriteRule{}}
	for _, r := range rules {
		if len(r.models) == 0 {
			t.generic = append(t.generic, r)
		}
		for _, m := range r.models {
			t.exact[m] = append(t.exact[m], r)
		}
	}
	slices.SortStableFunc(t.generic, older)
	for _, rs := range t.exact {
		slices.SortStableFunc(rs, older)
	}
	return t
}

// rewriteRules reads one InferenceModelRewrite's rules; matches is false
// when its poolRef names another pool; an error means it is malformed.
func rewriteRules(obj map[string]any, pool string) (rules []*rewriteRule, matches bool, err error) {
	name, _, _ := unstructured.NestedString(obj, "metadata", "name")
	if name == "" {
		return nil, false, errors.New("metadata.name is empty")
	}
	if ok, err := poolRefMatches(obj, pool); err != nil || !ok {
		return nil, false, err
	}
	var created time.Time
	if ts, _, _ := unstructured.NestedString(obj, "metadata", "creationTimestamp"); ts != "" {
		if created, err = time.Parse(time.RFC3339, ts); err != nil {
			return nil, true, fmt.Errorf("metadata.creationTimestamp: %w", err)
		}
	}
	raw, _, err := unstructured.NestedSlice(obj, "spec", "rules")
	if err != nil {
		return nil, true, fmt.Errorf("spec.rules: %w", err)
	}
	for i, rr := range raw {
		rm, ok := rr.(map[string]any)
		if !ok {
			return nil, true, fmt.Errorf("spec.rules[%d]: not an object", i)
		}
		r := &rewriteRule{rewrite: name, created: created}
		ms, _, err := unstructured.NestedSlice(rm, "matches")
		if err != nil {
			return nil, true, fmt.Errorf("spec.rules[%d].matches: %w", i, err)
		}
		for j, m := range ms {
			mm, _ := m.(map[string]any)
			value, _, _ := unstructured.NestedString(mm, "model", "value")
			typ, _, _ := unstructured.NestedString(mm, "model", "type")
			if value == "" || (typ != "" && typ != "Exact") {
				return nil, true, fmt.Errorf("spec.rules[%d].matches[%d]: want model {type: Exact, value}", i, j)
			}
			r.models = append(r.models, value)
		}
		ts, _, err := unstructured.NestedSlice(rm, "targets")
		if err != nil {
			return nil, true, fmt.Errorf("spec.rules[%d].targets: %w", i, err)
		}
		for j, tv := range ts {
			tm, _ := tv.(map[string]any)
			model, _, _ := unstructured.NestedString(tm, "modelRewrite")
			if model == "" {
				return nil, true, fmt.Errorf("spec.rules[%d].targets[%d].modelRewrite is empty", i, j)
			}
			target := RewriteTarget{Model: model}
			if w, found, _ := unstructured.NestedFieldNoCopy(tm, "weight"); found && w != nil {
				n, ok := w.(int64)
				if !ok || n < 0 || n > 1<<31-1 {
					return nil, true, fmt.Errorf("spec.rules[%d].targets[%d].weight %v: want a non-negative 32-bit integer", i, j, w)
				}
				w32 := int32(n)
				target.Weight = &w32
			}
			r.targets = append(r.targets, target)
		}
		rules = append(rules, r)
	}
	return rules, true, nil
}

// pick chooses a target by weight, as llm-d does: proportionally to the
// weights; uniformly when no target is weighted; "" without targets.
func pick(targets []RewriteTarget, rnd func(n int) int) string {
	if len(targets) == 0 {
		return ""
	}
	var total int64
	for _, t := range targets {
		if t.Weight != nil {
			total += int64(*t.Weight)
		}
	}
	if total == 0 {
		return targets[rnd(len(targets))].Model
	}
	n := int64(rnd(int(total)))
	var acc int64
	for _, t := range targets {
		if t.Weight != nil {
			acc += int64(*t.Weight)
		}
		if n < acc {
			return t.Model
		}
	}
	return targets[len(targets)-1].Model
}

// RewriteModel resolves a request's model through the pool's
// InferenceModelRewrites: the target model and the rewrite's name, or false
// when no rule applies (or none has a target). It never blocks; before the
// rewrites are first listed nothing resolves.
func (d *Discovery) RewriteModel(model string) (target, rewrite string, ok bool) {
	t := d.rewrites.Load()
	if t == nil {
		return "", "", false
	}
	r := t.rule(model)
	if r == nil {
		return "", "", false
	}
	target = pick(r.targets, rand.IntN)
	return target, r.rewrite, target != ""
}
