package rolloutscreener

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// draws returns the Float64 values it holds, in turn.
type draws struct{ v []float64 }

func (d *draws) Float64() float64 { x := d.v[0]; d.v = d.v[1:]; return x }
func (d *draws) IntN(int) int     { return 0 }

const setLabel = "disaggregatedset.x-k8s.io/name"

// server is a pod of the set (set "" for one outside the scope).
func server(name, set, rev, role, slice string) *endpoints.Endpoint {
	l := map[string]string{DefaultRevisionLabel: rev, DefaultRoleLabel: role, "disaggregatedset.x-k8s.io/slice": slice}
	if set != "" {
		l[setLabel] = set
	}
	return endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: name + ":8000", Labels: l})
}

// fleet is the README's rollout step: revision A 2 prefill 9 decode, B 1
// and 1, C (new, no decode yet) 1 prefill.
func fleet() []*endpoints.Endpoint {
	var eps []*endpoints.Endpoint
	add := func(rev, role string, n int) {
		for i := range n {
			eps = append(eps, server(fmt.Sprintf("%s-%s-%d", rev, role, i), "my-set", rev, role, fmt.Sprint(i%2)))
		}
	}
	add("A", "prefill", 2)
	add("A", "decode", 9)
	add("B", "prefill", 1)
	add("B", "decode", 1)
	add("C", "prefill", 1)
	return append(eps, server("other", "", "B", "decode", "0"), server("unlabelled", "my-set", "", "decode", "0"))
}

const selectors = `"headerSelectors":[
 {"name":"revision","headerName":"X-Disagg-Revision","labelKey":"` + DefaultRevisionLabel + `","mode":"strict"},
 {"name":"slice","headerName":"x-disagg-slice","labelKey":"disaggregatedset.x-k8s.io/slice","mode":"prefer"}]`

func params(gating string) string {
	return `{"scope":{"labelSelector":"` + setLabel + `=my-set"},` + selectors + `,"revisionGating":` + gating + `}`
}

func revisions(eps []*endpoints.Endpoint) map[string]int {
	m := map[string]int{}
	for _, e := range eps {
		m[e.Label(DefaultRevisionLabel)]++
	}
	return m
}

func TestScreen(t *testing.T) {
	maxRole := params(`{"mode":"max-role","requireRoles":{"values":["prefill","decode"]}}`)
	sum := params(`{"mode":"sum","requireRoles":{"values":["prefill","decode"]}}`)
	disabled := params(`{"mode":"disabled"}`)
	for _, tc := range []struct {
		name, params string
		headers      map[string]string
		draw         float64
		want         map[string]int // revision → endpoints kept
	}{
		// max-role: decode dominates (10 of the covered revisions' decode
		// servers against 3 prefill): A weighs 9, B 1.
		{name: "max-role draws A", params: maxRole, draw: 0.89, want: map[string]int{"A": 11}},
		{name: "max-role draws B", params: maxRole, draw: 0.91, want: map[string]int{"B": 3}},
		// sum: A 11, B 2 of 13.
		{name: "sum draws A", params: sum, draw: 10.9 / 13, want: map[string]int{"A": 11}},
		{name: "sum draws B", params: sum, draw: 11.1 / 13, want: map[string]int{"B": 3}},
		{name: "strict header pins B", params: maxRole, headers: map[string]string{"x-disagg-revision": "B"}, want: map[string]int{"B": 3}},
		{name: "strict header on an uncovered revision", params: maxRole, headers: map[string]string{"x-disagg-revision": "C"}, want: map[string]int{}},
		{name: "strict header, no match", params: maxRole, headers: map[string]string{"x-disagg-revision": "Z"}, want: map[string]int{}},
		{name: "prefer header does not screen", params: maxRole, headers: map[string]string{"x-disagg-slice": "1"}, draw: 0.5, want: map[string]int{"A": 11}},
		{name: "disabled keeps all", params: disabled, want: map[string]int{"A": 11, "B": 3, "C": 1, "": 1}},
		{name: "disabled, strict header", params: disabled, headers: map[string]string{"x-disagg-revision": "C"}, want: map[string]int{"C": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("rollout", json.RawMessage(tc.params), &scheduling.Handle{Rand: &draws{[]float64{tc.draw}}})
			if err != nil {
				t.Fatal(err)
			}
			eps := fleet()
			before := slices.Clone(eps)
			got := revisions(p.(scheduling.Screener).Screen(context.Background(), nil, &scheduling.Request{Headers: tc.headers}, eps))
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
			if !slices.Equal(eps, before) {
				t.Fatal("the candidates were modified")
			}
		})
	}
}

// Out-of-scope servers do not count: without them B has no decode server
// and gets nothing; a draw never picks an uncovered revision.
func TestWeights(t *testing.T) {
	p, err := New("", json.RawMessage(params(`{"mode":"max-role","requireRoles":{"values":["prefill","decode"]}}`)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*Screener)
	eps := fleet()
	if got := s.weights(eps); fmt.Sprint(got) != "map[A:9 B:1]" {
		t.Fatalf("max-role weights %v", got)
	}
	eps = slices.DeleteFunc(eps, func(e *endpoints.Endpoint) bool { return e.Name() == "B-decode-0" })
	if got := s.weights(eps); fmt.Sprint(got) != "map[A:9]" {
		t.Fatalf("weights without B's in-scope decode %v: the out-of-scope one must not count", got)
	}
	// Equal totals: the first required role wins.
	tie := []*endpoints.Endpoint{server("p1", "my-set", "A", "prefill", ""), server("d1", "my-set", "A", "decode", ""),
		server("p2", "my-set", "B", "prefill", ""), server("p3", "my-set", "B", "prefill", ""),
		server("d2", "my-set", "B", "decode", ""), server("d3", "my-set", "A", "decode", "")}
	if got := s.weights(tie); fmt.Sprint(got) != "map[A:1 B:2]" {
		t.Fatalf("tie weights %v, want prefill's", got)
	}
	shares := map[string]int{}
	for i := range 1000 {
		s.rand = &draws{[]float64{float64(i) / 1000}}
		shares[s.draw(map[string]int{"A": 9, "B": 1})]++
	}
	if math.Abs(float64(shares["B"])-100) > 1 {
		t.Fatalf("draw shares %v, want B 10%%", shares)
	}
}

func TestResponseHeader(t *testing.T) {
	p, err := New("", json.RawMessage(params(`{"mode":"disabled"}`)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*Screener)
	rh := &scheduling.ResponseHead{Endpoint: server("d", "my-set", "B", "decode", "1")}
	s.ResponseHeader(context.Background(), nil, nil, rh)
	if got := fmt.Sprint(rh.SetHeaders()); got != "map[x-disagg-revision:B x-disagg-slice:1]" {
		t.Fatalf("stamped %s", got)
	}
	rh = &scheduling.ResponseHead{}
	s.ResponseHeader(context.Background(), nil, nil, rh)
	if len(rh.SetHeaders()) != 0 {
		t.Fatal("no endpoint, nothing to stamp")
	}
}

func TestParams(t *testing.T) {
	scope := `"scope":{"labelSelector":"a=b"}`
	gating := `"revisionGating":{"mode":"disabled"}`
	sel := func(s string) string { return `"headerSelectors":[` + s + `]` }
	for _, tc := range []struct{ params, err string }{
		{`{` + gating + `}`, "scope.labelSelector is required"},
		{`{"scope":{"labelSelector":"a in (b"},` + gating + `}`, "scope.labelSelector"},
		{`{` + scope + `}`, "revisionGating is required"},
		{`{` + scope + `,"revisionGating":{"mode":"max"}}`, `mode "max" must be`},
		{`{` + scope + `,"revisionGating":{"mode":"sum"}}`, "requireRoles.values must name"},
		{`{` + scope + `,"revisionGating":{"mode":"sum","requireRoles":{"values":[]}}}`, "requireRoles.values must name"},
		{`{` + scope + `,"revisionGating":{"mode":"sum","requireRoles":{"values":["p",""]}}}`, "values[1] is empty"},
		{`{` + scope + `,"revisionGating":{"mode":"sum","requireRoles":{"values":["p","p"]}}}`, `duplicate role "p"`},
		{`{` + scope + `,` + gating + `,` + sel(`{"headerName":"h","labelKey":"l","mode":"strict"}`) + `}`, "headerSelectors[0].name is required"},
		{`{` + scope + `,` + gating + `,` + sel(`{"name":"n","labelKey":"l","mode":"strict"}`) + `}`, "headerName is required"},
		{`{` + scope + `,` + gating + `,` + sel(`{"name":"n","headerName":"h","mode":"strict"}`) + `}`, "labelKey is required"},
		{`{` + scope + `,` + gating + `,` + sel(`{"name":"n","headerName":"h","labelKey":"l","mode":"soft"}`) + `}`, `mode "soft" must be`},
		{`{` + scope + `,` + gating + `,` + sel(`{"name":"n","headerName":"h","labelKey":"l","mode":"strict"},{"name":"n","headerName":"g","labelKey":"l","mode":"strict"}`) + `}`, `duplicate name "n"`},
		{`{` + scope + `,` + gating + `,` + sel(`{"name":"n","headerName":"H","labelKey":"l","mode":"strict"},{"name":"m","headerName":"h","labelKey":"l","mode":"prefer"}`) + `}`, `duplicate headerName "h"`},
		{`{` + scope + `,` + gating + `,"extra":1}`, `unknown field "extra"`},
		{`{` + scope + `,"revisionGating":{"mode":"sum","requireRoles":{"values":["p"]},"revisionLabelKey":"r","roleLabelKey":"o"}}`, ""},
	} {
		_, err := New("", json.RawMessage(tc.params), nil)
		if tc.err == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.params, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want %q", tc.params, err, tc.err)
		}
	}
}
