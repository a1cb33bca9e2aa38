package headerfilter

import (
	"context"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestFilter(t *testing.T) {
	at := func(name, addr string) *endpoints.Endpoint {
		return endpoints.NewEndpoint(endpoints.Spec{Name: name, Address: addr})
	}
	eps := func() []*endpoints.Endpoint {
		return []*endpoints.Endpoint{
			at("a", "10.0.0.1:8000"), at("b", "10.0.0.1:8001"), at("c", "10.0.0.2:8000"), at("d", "[fd00::1]:8000"),
		}
	}
	f, err := schedtest.Build[scheduling.Filter](New, "")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		header string
		set    bool
		want   []string
	}{
		{set: false, want: []string{}},
		{header: " ", set: true, want: []string{}},
		{header: "10.0.0.1", set: true, want: []string{"a", "b"}},
		{header: "10.0.0.1:8001", set: true, want: []string{"b"}},
		{header: "10.0.0.1:9999", set: true, want: []string{}},
		// Candidates keep their order whatever the header's.
		{header: "10.0.0.2, 10.0.0.1:8000", set: true, want: []string{"a", "c"}},
		{header: "[fd00::1]:8000", set: true, want: []string{"d"}},
		{header: "fd00::1", set: true, want: []string{"d"}},
		{header: "[fd00::1]", set: true, want: []string{"d"}},
		{header: "10.0.0.9,,garbage:", set: true, want: []string{}},
	}
	for _, tc := range tests {
		req := &scheduling.Request{Headers: map[string]string{}}
		if tc.set {
			req.Headers[Header] = tc.header
		}
		got := schedtest.Names(f.Filter(context.Background(), nil, req, eps()))
		if !slices.Equal(got, tc.want) {
			t.Errorf("header %q: kept %v, want %v", tc.header, got, tc.want)
		}
	}
	if _, err := New("", []byte(`{"header": "x"}`), nil); err == nil {
		t.Error("parameters accepted")
	}
}
