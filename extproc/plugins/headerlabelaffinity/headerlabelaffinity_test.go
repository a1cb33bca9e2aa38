package headerlabelaffinity

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestScorer(t *testing.T) {
	const slice = "disaggregatedset.x-k8s.io/slice"
	ep := func(name, value string) *endpoints.Endpoint {
		labels := map[string]string{}
		if value != "" {
			labels[slice] = value
		}
		return endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: name + ":8000", Labels: labels})
	}
	eps := []*endpoints.Endpoint{ep("s0", "0"), ep("s1", "1"), ep("none", "")}
	params := `{"headerName":"X-Disagg-Slice","labelKey":"` + slice + `"}`
	for _, tc := range []struct {
		name, params string
		headers      map[string]string
		want         []float64
		err          string
	}{
		{name: "match", params: params, headers: map[string]string{"x-disagg-slice": "1"}, want: []float64{0, 1, 0}},
		{name: "no header", params: params, want: []float64{0, 0, 0}},
		{name: "empty header", params: params, headers: map[string]string{"x-disagg-slice": ""}, want: []float64{0, 0, 0}},
		{name: "unknown value", params: params, headers: map[string]string{"x-disagg-slice": "7"}, want: []float64{0, 0, 0}},
		{name: "other header", params: params, headers: map[string]string{"x-other": "0"}, want: []float64{0, 0, 0}},
		{name: "no parameters", err: "headerName is required"},
		{name: "no label", params: `{"headerName":"x"}`, err: "labelKey is required"},
		{name: "unknown field", params: `{"headerName":"x","labelKey":"y","mode":"strict"}`, err: `unknown field "mode"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("slice-affinity", json.RawMessage(tc.params), &scheduling.Handle{})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			scores := []float64{9, 9, 9}
			p.(scheduling.Scorer).Score(context.Background(), nil, &scheduling.Request{Headers: tc.headers}, eps, scores)
			if !slices.Equal(scores, tc.want) {
				t.Fatalf("scores %v, want %v", scores, tc.want)
			}
		})
	}
}
