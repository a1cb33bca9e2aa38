package all

import (
	"errors"
	"testing"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Every registered type (and alias) builds with default parameters, and
// nothing is registered twice (Registry would panic).
func TestEveryPluginBuildsWithDefaults(t *testing.T) {
	r := Registry()
	h := &scheduling.Handle{Services: map[string]any{precise.ServiceKVIndex: kvindex.New(kvindex.Config{})}}
	for _, typ := range r.Types() {
		p, err := r.Build(typ, "", nil, h)
		if err != nil {
			t.Errorf("%s: %v", typ, err)
			continue
		}
		if p.TypedName().Name == "" {
			t.Errorf("%s: empty name", typ)
		}
	}
	var unknown *scheduling.UnknownTypeError
	if _, err := r.Build("nope", "", nil, h); !errors.As(err, &unknown) {
		t.Fatalf("unknown type error = %v", err)
	}
}
