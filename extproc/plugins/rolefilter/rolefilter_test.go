package rolefilter

import (
	"context"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

func TestFilters(t *testing.T) {
	eps := func() []*endpoints.Endpoint {
		return []*endpoints.Endpoint{
			schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill"),
			schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode"),
			schedtest.Endpoint("b", endpoints.Metrics{}, endpoints.RoleLabel, "both"),
			schedtest.Endpoint("e", endpoints.Metrics{}, endpoints.RoleLabel, "encode"),
			schedtest.Endpoint("u", endpoints.Metrics{}),
			schedtest.Endpoint("1", endpoints.Metrics{}, endpoints.RoleLabel, "encode-prefill"),
			schedtest.Endpoint("2", endpoints.Metrics{}, endpoints.RoleLabel, "encode-decode"),
			schedtest.Endpoint("3", endpoints.Metrics{}, endpoints.RoleLabel, "prefill-decode"),
			schedtest.Endpoint("4", endpoints.Metrics{}, endpoints.RoleLabel, "encode-prefill-decode"),
			schedtest.Endpoint("x", endpoints.Metrics{}, endpoints.RoleLabel, "Decode"),
		}
	}
	tests := []struct {
		factory scheduling.Factory
		want    string
	}{
		{NewDecode, "dbu234"},
		{NewPrefill, "pb134"},
		{NewEncode, "e124"},
	}
	for _, tc := range tests {
		f, err := schedtest.Build[scheduling.Filter](tc.factory, "")
		if err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		for _, e := range f.Filter(context.Background(), nil, &scheduling.Request{}, eps()) {
			got.WriteString(e.Name())
		}
		if got.String() != tc.want {
			t.Errorf("%s kept %q, want %q", f.TypedName(), got.String(), tc.want)
		}
	}
}
