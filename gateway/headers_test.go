package gateway

import (
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestApplyAsEnvoy: header mutations as Envoy's ext_proc filter applies
// them. Its HeaderMutation says append defaults to false there, so a set
// header with neither append nor an append_action replaces: GIE's picker
// sets content-length (after rewriting the body) and the destination that
// way. Before, such a set was appended, the client's content-length stayed
// first and was the one forwarded, with the picker's body of another length.
func TestApplyAsEnvoy(t *testing.T) {
	base := headerList{{":path", "/v1/completions"}, {"content-length", "10"}, {"x-a", "1"}}
	set := func(o *corev3.HeaderValueOption) *extprocv3.HeaderMutation {
		return &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{o}}
	}
	hv := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
	for _, tc := range []struct {
		name string
		m    *extprocv3.HeaderMutation
		want headerList
	}{
		{"unset replaces", set(&corev3.HeaderValueOption{Header: hv("Content-Length", "12")}),
			headerList{{":path", "/v1/completions"}, {"x-a", "1"}, {"content-length", "12"}}},
		{"append true adds", set(&corev3.HeaderValueOption{Header: hv("x-a", "2"), Append: wrapperspb.Bool(true)}),
			append(slices.Clone(base), [2]string{"x-a", "2"})},
		{"append false replaces", set(&corev3.HeaderValueOption{Header: hv("x-a", "2"), Append: wrapperspb.Bool(false)}),
			headerList{{":path", "/v1/completions"}, {"content-length", "10"}, {"x-a", "2"}}},
		{"add if absent, present", set(&corev3.HeaderValueOption{Header: hv("x-a", "2"), AppendAction: corev3.HeaderValueOption_ADD_IF_ABSENT}),
			base},
		{"overwrite if exists, absent", set(&corev3.HeaderValueOption{Header: hv("x-b", "2"), AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS}),
			base},
		{"pseudo-headers and host stay", &extprocv3.HeaderMutation{RemoveHeaders: []string{":path", "host"},
			SetHeaders: []*corev3.HeaderValueOption{{Header: hv(":path", "/admin")}, {Header: hv("host", "evil")}}}, base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := slices.Clone(base).apply(tc.m); !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
