package all

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Every registered type (and alias) builds with default parameters, and
// nothing is registered twice (Registry would panic).
func TestEveryPluginBuildsWithDefaults(t *testing.T) {
	r := Registry()
	h := &scheduling.Handle{Services: map[string]any{precise.ServiceKVIndex: kvindex.New(kvindex.Config{})}}
	for _, typ := range r.Types() {
		p, err := r.Build(typ, "", minimalParams(typ, ""), h)
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

// requiredParams are the parameters a type cannot do without (llm-d has no
// default for them), given to every build that tests something else.
var requiredParams = map[string]string{
	flowpolicy.HoldbackType: `"minCeiling": 0.5`,
}

// minimalParams is {field, the type's required parameters}; nil when both
// are empty.
func minimalParams(typ, field string) []byte {
	parts := []string{}
	if field != "" {
		parts = append(parts, field)
	}
	if req, ok := requiredParams[typ]; ok {
		parts = append(parts, req)
	}
	if len(parts) == 0 {
		return nil
	}
	return []byte("{" + strings.Join(parts, ", ") + "}")
}
