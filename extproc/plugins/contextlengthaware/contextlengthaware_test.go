package contextlengthaware

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestFilterAndScore(t *testing.T) {
	ep := func(name, r string) *endpoints.Endpoint {
		labels := map[string]string{}
		if r != "" {
			labels[DefaultLabel] = r
		}
		return endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: name + ":8000", Labels: labels})
	}
	eps := []*endpoints.Endpoint{ep("short", "0-2048"), ep("long", "2048-32768"), ep("any", ""), ep("bad", "x-1"), ep("one", "100-100")}
	for _, tc := range []struct {
		name, params string
		tokens       int
		kept         []string
		scores       []float64
	}{
		{"short prompt", `{"enableFiltering":true}`, 1000, []string{"short", "any"},
			[]float64{0.3 + 0.7*(0.7/1.2048+0.3*1048.0/2048), 0.3 / 2.048, 0.5, 0, 0.3 / 1.9}},
		{"long prompt", `{"enableFiltering":true}`, 4096, []string{"long", "any"},
			[]float64{0.3 / 3.048, 0.3 + 0.7*(0.7/4.072+0.3*28672.0/30720), 0.5, 0, 0.3 / 4.996}},
		{"exact one-length range", `{"enableFiltering":true}`, 100, []string{"short", "any", "one"},
			[]float64{0.3 + 0.7*(0.7/1.2048+0.3*1948.0/2048), 0.3 / 2.948, 0.5, 0, 1}},
		{"scoring only", `{}`, 4096, []string{"short", "long", "any", "bad", "one"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := New("", []byte(tc.params), nil)
			if err != nil {
				t.Fatal(err)
			}
			p := pl.(*Plugin)
			req := &scheduling.Request{PromptTokens: tc.tokens}
			var kept []string
			for _, e := range p.Filter(context.Background(), nil, req, eps) {
				kept = append(kept, e.Name())
			}
			if !slices.Equal(kept, tc.kept) {
				t.Errorf("kept %v, want %v", kept, tc.kept)
			}
			if tc.scores == nil {
				return
			}
			scores := make([]float64, len(eps))
			p.Score(context.Background(), nil, req, eps, scores)
			for i := range scores {
				if math.Abs(scores[i]-tc.scores[i]) > 1e-9 {
					t.Errorf("%s: score %v, want %v", eps[i].Name(), scores[i], tc.scores[i])
				}
			}
		})
	}
}

func TestParams(t *testing.T) {
	for params, want := range map[string]string{
		`{"label":""}`:          "label",
		`{"mode":"filter"}`:     `unknown field "mode"`,
		`{"enableFiltering":1}`: "cannot unmarshal",
	} {
		if _, err := New("", []byte(params), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", params, err, want)
		}
	}
	pl, err := New("", []byte(`{"label":"ctx"}`), nil)
	if err != nil || pl.(*Plugin).label != "ctx" || pl.(*Plugin).filter {
		t.Fatalf("%+v, %v", pl, err)
	}
}
