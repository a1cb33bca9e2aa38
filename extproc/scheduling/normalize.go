package scheduling

import (
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// InverseMinMax scores each candidate by where value(e) lies between the
// smallest and largest value among candidates: the smallest scores 1, the
// largest 0, and all score 1 when they are equal. It is the shape of GIE's
// queue scorer, shared by every "less load is better" scorer.
func InverseMinMax(candidates []*endpoints.Endpoint, scores []float64, value func(*endpoints.Endpoint) float64) {
	if len(candidates) == 0 {
		return
	}
	lo, hi := value(candidates[0]), value(candidates[0])
	for i, e := range candidates {
		v := value(e)
		scores[i] = v
		lo, hi = min(lo, v), max(hi, v)
	}
	if hi == lo {
		for i := range scores[:len(candidates)] {
			scores[i] = 1
		}
		return
	}
	for i, v := range scores[:len(candidates)] {
		scores[i] = (hi - v) / (hi - lo)
	}
}

// Named gives plugins their TypedName with one embedded field.
type Named struct{ TN TypedName }

// TypedName implements Plugin.
func (n Named) TypedName() TypedName { return n.TN }

// NewNamed returns the identity of a plugin of type typ configured as name
// (the type when name is empty).
func NewNamed(typ, name string) Named {
	if name == "" {
		name = typ
	}
	return Named{TN: TypedName{Type: typ, Name: name}}
}

// NoParams is the identity of a plugin that takes no parameters: it fails
// when the configuration gives any, so that a misplaced parameter is not
// silently ignored.
func NoParams(typ, name string, params json.RawMessage) (Named, error) {
	if err := DecodeParams(params, &struct{}{}); err != nil {
		return Named{}, err
	}
	return NewNamed(typ, name), nil
}
