package endpointattribute

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/dcgm"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// fleet is four endpoints and a dcgm-extractor that read their exporters'
// pages: a 10%, b 50%, c 90%, d without a GPU sample.
func fleet(t *testing.T) ([]*endpoints.Endpoint, func(string) (scheduling.Plugin, bool)) {
	t.Helper()
	xp, err := dcgm.NewExtractor("dcgm-extractor", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := xp.(*dcgm.Extractor)
	var eps []*endpoints.Endpoint
	for i, util := range []int{10, 50, 90, -1} {
		name := string(rune('a' + i))
		e := endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: fmt.Sprintf("10.0.0.%d:8000", i+1)})
		page := "DCGM_FI_DEV_FB_USED 1\n"
		if util >= 0 {
			page = fmt.Sprintf("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",pod=%q} %d\n", name, util)
		}
		if err := x.Read(e, []byte(page)); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, e)
	}
	queue := scheduling.NewNamed("queue-scorer", "queue")
	lookup := func(name string) (scheduling.Plugin, bool) {
		switch name {
		case "dcgm-extractor":
			return x, true
		case "queue":
			return queue, true
		}
		return nil, false
	}
	return eps, lookup
}

func TestFilter(t *testing.T) {
	eps, lookup := fleet(t)
	for _, tc := range []struct {
		name, params, want string
	}{
		{name: "the sim config's gate", params: `"onMissing":"Pass","fallbackOnEmpty":true,"algorithm":{"type":"threshold","threshold":{"operator":"LessThanOrEqual","value":0.9}}`, want: "a,b,c,d"},
		{name: "below half, missing passes", params: `"algorithm":{"type":"threshold","threshold":{"operator":"LessThan","value":0.5}}`, want: "a,d"},
		{name: "missing fails", params: `"onMissing":"Fail","algorithm":{"type":"threshold","threshold":{"operator":"GreaterThanOrEqual","value":0.5}}`, want: "b,c"},
		{name: "greater than", params: `"onMissing":"Fail","algorithm":{"type":"threshold","threshold":{"operator":"GreaterThan","value":0.5}}`, want: "c"},
		{name: "equal", params: `"onMissing":"Fail","algorithm":{"type":"threshold","threshold":{"operator":"Equal","value":0.5}}`, want: "b"},
		{name: "not equal", params: `"onMissing":"Fail","algorithm":{"type":"threshold","threshold":{"operator":"NotEqual","value":0.5}}`, want: "a,c"},
		{name: "all dropped", params: `"onMissing":"Fail","algorithm":{"type":"threshold","threshold":{"operator":"LessThan","value":0}}`, want: ""},
		{name: "all dropped, fallback", params: `"onMissing":"Fail","fallbackOnEmpty":true,"algorithm":{"type":"threshold","threshold":{"operator":"LessThan","value":0}}`, want: "a,b,c,d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewFilter("f", []byte(`{"attribute":"GPUUtilization","producer":"dcgm-extractor",`+tc.params+`}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			f := p.(*Filter)
			if err := f.Resolve(lookup); err != nil {
				t.Fatal(err)
			}
			in := append([]*endpoints.Endpoint(nil), eps...)
			if got := strings.Join(schedtest.Names(f.Filter(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, in)), ","); got != tc.want {
				t.Fatalf("kept %q, want %q", got, tc.want)
			}
		})
	}
}

func TestScorer(t *testing.T) {
	eps, lookup := fleet(t)
	for _, tc := range []struct {
		name, algorithm string
		want            []float64
	}{
		{name: "adaptive, lower is better", algorithm: `{"type":"linear_lower_is_better"}`, want: []float64{1, 0.5, 0, 0}},
		{name: "adaptive, higher is better", algorithm: `{"type":"linear_higher_is_better","normalization":{"adaptiveRange":{}}}`, want: []float64{0, 0.5, 1, 0}},
		{name: "the sim config's fixed range", algorithm: `{"type":"linear_lower_is_better","normalization":{"fixedRange":{"min":0,"max":1}}}`, want: []float64{0.9, 0.5, 0.1, 0}},
		{name: "fixed range clamps", algorithm: `{"type":"linear_higher_is_better","normalization":{"fixedRange":{"min":0.2,"max":0.6}}}`, want: []float64{0, 0.75, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewScorer("s", []byte(`{"attributeKey":"GPUUtilization","producer":"dcgm-extractor","algorithm":`+tc.algorithm+`}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			s := p.(*Scorer)
			if err := s.Resolve(lookup); err != nil {
				t.Fatal(err)
			}
			scores := make([]float64, len(eps))
			s.Score(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, eps, scores)
			for i := range scores {
				if d := scores[i] - tc.want[i]; d > 1e-9 || d < -1e-9 {
					t.Fatalf("scores %v, want %v", scores, tc.want)
				}
			}
		})
	}
	// Every endpoint with the attribute alike: all 1, the missing one 0.
	p, _ := NewScorer("s", []byte(`{"attributeKey":"GPUUtilization","producer":"dcgm-extractor","algorithm":{"type":"linear_lower_is_better"}}`), nil)
	s := p.(*Scorer)
	_ = s.Resolve(lookup)
	scores := make([]float64, 2)
	s.Score(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, []*endpoints.Endpoint{eps[1], eps[3]}, scores)
	if scores[0] != 1 || scores[1] != 0 {
		t.Fatalf("one valued endpoint: %v", scores)
	}
}

func TestParams(t *testing.T) {
	_, lookup := fleet(t)
	th := `"algorithm":{"type":"threshold","threshold":{"operator":"LessThan","value":1}}`
	for _, tc := range []struct {
		scorer       bool
		params, want string
	}{
		{params: `{` + th + `,"producer":"dcgm-extractor"}`, want: "attribute is required"},
		{params: `{"attribute":"GPUUtilization",` + th + `}`, want: "parameters.producer is not supported"},
		{params: `{"attribute":"x","producer":"",` + th + `}`, want: "parameters.producer is not supported"},
		{params: `{"attribute":"GPUUtilization","producer":"dcgm-extractor","onMissing":"Keep",` + th + `}`, want: "Pass or Fail"},
		{params: `{"attribute":"GPUUtilization","producer":"dcgm-extractor","algorithm":{"type":"topK"}}`, want: "want threshold"},
		{params: `{"attribute":"GPUUtilization","producer":"dcgm-extractor","algorithm":{"type":"threshold"}}`, want: "threshold is required"},
		{params: `{"attribute":"GPUUtilization","producer":"dcgm-extractor","algorithm":{"type":"threshold","threshold":{"operator":"<"}}}`, want: "none of"},
		{scorer: true, params: `{"attributeKey":"GPUUtilization","producer":"dcgm-extractor","algorithm":{"type":"quadratic"}}`, want: "linear_lower_is_better"},
		{scorer: true, params: `{"attributeKey":"GPUUtilization","producer":"dcgm-extractor","algorithm":{"type":"linear_lower_is_better","normalization":{"fixedRange":{"min":1,"max":1}}}}`, want: "less than max"},
		{scorer: true, params: `{"attributeKey":"GPUUtilization","producer":"dcgm-extractor","algorithm":{"type":"linear_lower_is_better","normalization":{"adaptiveRange":{},"fixedRange":{"min":0,"max":1}}}}`, want: "give one"},
		{scorer: true, params: `{"attributeKey":"a","producer":"x","algorithm":{"type":"linear_lower_is_better"},"extra":1}`, want: "unknown field"},
	} {
		f := NewFilter
		if tc.scorer {
			f = NewScorer
		}
		if _, err := f("", []byte(tc.params), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.params, err, tc.want)
		}
	}
	for producer, want := range map[string]string{
		"missing": `"missing" is not a configured plugin`,
		"queue":   "is not a producer of endpoint attributes",
	} {
		p, _ := NewFilter("", []byte(`{"attribute":"GPUUtilization","producer":"`+producer+`",`+th+`}`), nil)
		if err := p.(*Filter).Resolve(lookup); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("producer %s: err = %v, want %q", producer, err, want)
		}
	}
	p, _ := NewScorer("", []byte(`{"attributeKey":"GPUMemory","producer":"dcgm-extractor","algorithm":{"type":"linear_lower_is_better"}}`), nil)
	if err := p.(*Scorer).Resolve(lookup); err == nil || !strings.Contains(err.Error(), `not "GPUMemory"`) {
		t.Errorf("unpublished attribute: %v", err)
	}
}
