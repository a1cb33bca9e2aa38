// Package rolefilter holds the disaggregation role filters decode-filter,
// prefill-filter and encode-filter. They keep the endpoints whose pod label
// llm-d.ai/role allows the stage, over every role value llm-d defines:
// decode keeps decode, prefill-decode, encode-decode, encode-prefill-decode,
// both (deprecated for prefill-decode) and unlabelled servers (a plain
// aggregated fleet has no roles and must keep working); prefill keeps
// prefill, encode-prefill, prefill-decode, encode-prefill-decode and both;
// encode keeps encode, encode-prefill, encode-decode and
// encode-prefill-decode. (llm-d's filters leave encode-decode, a role its
// documentation defines for E/PD servers, out of both lists.)
//
// Parameters: none.
package rolefilter

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	DecodeType  = "decode-filter"
	PrefillType = "prefill-filter"
	EncodeType  = "encode-filter"
)

// Filter keeps endpoints whose role is in its allowed set.
type Filter struct {
	scheduling.Named
	allowed map[string]bool
}

func factory(typ string, roles ...string) scheduling.Factory {
	return func(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
		n, err := scheduling.NoParams(typ, name, params)
		if err != nil {
			return nil, err
		}
		f := &Filter{Named: n, allowed: map[string]bool{}}
		for _, r := range roles {
			f.allowed[r] = true
		}
		return f, nil
	}
}

// Factories for each role filter.
var (
	NewDecode  = factory(DecodeType, "decode", "prefill-decode", "encode-decode", "encode-prefill-decode", "both", "")
	NewPrefill = factory(PrefillType, "prefill", "encode-prefill", "prefill-decode", "encode-prefill-decode", "both")
	NewEncode  = factory(EncodeType, "encode", "encode-prefill", "encode-decode", "encode-prefill-decode")
)

// Filter implements scheduling.Filter.
func (f *Filter) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	kept := eps[:0]
	for _, e := range eps {
		if f.allowed[e.Label(endpoints.RoleLabel)] {
			kept = append(kept, e)
		}
	}
	return kept
}
