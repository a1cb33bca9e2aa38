package rolloutscreener

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "disaggregatedset-rollout-screener"

// The DisaggregatedSet controller's labels, the label-key defaults.
const (
	DefaultRevisionLabel = "disaggregatedset.x-k8s.io/revision"
	DefaultRoleLabel     = "disaggregatedset.x-k8s.io/role"
)

// Selector modes and gating modes.
const (
	ModeStrict     = "strict"
	ModePrefer     = "prefer"
	GatingSum      = "sum"
	GatingMaxRole  = "max-role"
	GatingDisabled = "disabled"
)

// Params are the plugin's parameters.
type Params struct {
	Scope           Scope            `json:"scope"`
	HeaderSelectors []HeaderSelector `json:"headerSelectors"`
	RevisionGating  *RevisionGating  `json:"revisionGating"`
}

// Scope selects the servers counted for revision coverage.
type Scope struct {
	LabelSelector string `json:"labelSelector"`
}

// HeaderSelector maps a request and response header onto an endpoint label.
type HeaderSelector struct {
	Name       string `json:"name"`
	HeaderName string `json:"headerName"`
	LabelKey   string `json:"labelKey"`
	Mode       string `json:"mode"`
}

// RevisionGating configures revision coverage and the weighted choice.
type RevisionGating struct {
	Mode             string        `json:"mode"`
	RequireRoles     *RequireRoles `json:"requireRoles"`
	RevisionLabelKey string        `json:"revisionLabelKey"`
	RoleLabelKey     string        `json:"roleLabelKey"`
}

// RequireRoles are the roles a revision needs a Ready server of.
type RequireRoles struct {
	Values []string `json:"values"`
}

// Screener implements disaggregatedset-rollout-screener.
type Screener struct {
	scheduling.Named
	scope     labels.Selector
	selectors []HeaderSelector
	gating    bool
	maxRole   bool
	roles     []string
	revision  string
	role      string
	rand      scheduling.Rand
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Scope.LabelSelector == "" {
		return nil, errors.New("parameters.scope.labelSelector is required")
	}
	scope, err := labels.Parse(p.Scope.LabelSelector)
	if err != nil {
		return nil, fmt.Errorf("parameters.scope.labelSelector: %w", err)
	}
	names, headers := map[string]bool{}, map[string]bool{}
	for i := range p.HeaderSelectors {
		sel := &p.HeaderSelectors[i]
		at := fmt.Sprintf("parameters.headerSelectors[%d]", i)
		switch {
		case sel.Name == "":
			return nil, fmt.Errorf("%s.name is required", at)
		case sel.HeaderName == "":
			return nil, fmt.Errorf("%s.headerName is required", at)
		case sel.LabelKey == "":
			return nil, fmt.Errorf("%s.labelKey is required", at)
		case sel.Mode != ModeStrict && sel.Mode != ModePrefer:
			return nil, fmt.Errorf("%s.mode %q must be strict or prefer", at, sel.Mode)
		}
		sel.HeaderName = strings.ToLower(sel.HeaderName)
		if names[sel.Name] {
			return nil, fmt.Errorf("%s: duplicate name %q", at, sel.Name)
		}
		if headers[sel.HeaderName] {
			return nil, fmt.Errorf("%s: duplicate headerName %q", at, sel.HeaderName)
		}
		names[sel.Name], headers[sel.HeaderName] = true, true
	}
	g := p.RevisionGating
	if g == nil {
		return nil, errors.New("parameters.revisionGating is required")
	}
	s := &Screener{Named: scheduling.NewNamed(Type, name), scope: scope, selectors: p.HeaderSelectors,
		revision: cmp.Or(g.RevisionLabelKey, DefaultRevisionLabel), role: cmp.Or(g.RoleLabelKey, DefaultRoleLabel), rand: scheduling.RandOf(h)}
	switch g.Mode {
	case GatingDisabled:
	case GatingSum, GatingMaxRole:
		if g.RequireRoles == nil || len(g.RequireRoles.Values) == 0 {
			return nil, fmt.Errorf("parameters.revisionGating.requireRoles.values must name at least one role with mode %s", g.Mode)
		}
		seen := map[string]bool{}
		for i, r := range g.RequireRoles.Values {
			if r == "" {
				return nil, fmt.Errorf("parameters.revisionGating.requireRoles.values[%d] is empty", i)
			}
			if seen[r] {
				return nil, fmt.Errorf("parameters.revisionGating.requireRoles.values: duplicate role %q", r)
			}
			seen[r] = true
		}
		s.gating, s.maxRole, s.roles = true, g.Mode == GatingMaxRole, g.RequireRoles.Values
	default:
		return nil, fmt.Errorf("parameters.revisionGating.mode %q must be sum, max-role or disabled", g.Mode)
	}
	return s, nil
}

// Screen implements scheduling.Screener.
func (s *Screener) Screen(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	var headers map[string]string
	if req != nil {
		headers = req.Headers
	}
	kept := eps
	if s.gating {
		weights := s.weights(eps)
		chosen := ""
		if !s.strictHeader(headers) {
			chosen = s.draw(weights)
		}
		kept = make([]*endpoints.Endpoint, 0, len(eps))
		for _, e := range eps {
			rev := e.Label(s.revision)
			if weights[rev] > 0 && (chosen == "" || rev == chosen) {
				kept = append(kept, e)
			}
		}
	}
	for _, sel := range s.selectors {
		want := headers[sel.HeaderName]
		if sel.Mode != ModeStrict || want == "" {
			continue
		}
		matched := make([]*endpoints.Endpoint, 0, len(kept))
		for _, e := range kept {
			if e.Label(sel.LabelKey) == want {
				matched = append(matched, e)
			}
		}
		kept = matched
	}
	return kept
}

// weights are the covered revisions' weights; an uncovered one is absent.
func (s *Screener) weights(eps []*endpoints.Endpoint) map[string]int {
	counts := map[string]map[string]int{}
	for _, e := range eps {
		rev := e.Label(s.revision)
		if rev == "" || !s.scope.Matches(labels.Set(e.Spec().Labels)) {
			continue
		}
		if counts[rev] == nil {
			counts[rev] = map[string]int{}
		}
		counts[rev][e.Label(s.role)]++
	}
	totals := make([]int, len(s.roles))
	for rev, byRole := range counts {
		for _, r := range s.roles {
			if byRole[r] == 0 {
				delete(counts, rev)
				break
			}
		}
	}
	weights := make(map[string]int, len(counts))
	if s.maxRole {
		for _, byRole := range counts {
			for i, r := range s.roles {
				totals[i] += byRole[r]
			}
		}
		dominant := 0
		for i := range totals {
			if totals[i] > totals[dominant] {
				dominant = i
			}
		}
		for rev, byRole := range counts {
			weights[rev] = byRole[s.roles[dominant]]
		}
		return weights
	}
	for rev, byRole := range counts {
		for _, r := range s.roles {
			weights[rev] += byRole[r]
		}
	}
	return weights
}

// draw picks a revision with probability proportional to its weight.
func (s *Screener) draw(weights map[string]int) string {
	revs := make([]string, 0, len(weights))
	total := 0
	for rev, w := range weights {
		revs = append(revs, rev)
		total += w
	}
	if total == 0 {
		return ""
	}
	sort.Strings(revs)
	x := s.rand.Float64() * float64(total)
	for _, rev := range revs {
		if x -= float64(weights[rev]); x < 0 {
			return rev
		}
	}
	return revs[len(revs)-1]
}

func (s *Screener) strictHeader(headers map[string]string) bool {
	for _, sel := range s.selectors {
		if sel.Mode == ModeStrict && headers[sel.HeaderName] != "" {
			return true
		}
	}
	return false
}

// ResponseHeader implements scheduling.ResponseHeader: every selector's
// header carries the serving endpoint's label.
func (s *Screener) ResponseHeader(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, res *scheduling.ResponseHead) {
	if res.Endpoint == nil {
		return
	}
	for _, sel := range s.selectors {
		if v := res.Endpoint.Label(sel.LabelKey); v != "" {
			res.Set(sel.HeaderName, v)
		}
	}
}

var (
	_ scheduling.Screener       = (*Screener)(nil)
	_ scheduling.ResponseHeader = (*Screener)(nil)
)
