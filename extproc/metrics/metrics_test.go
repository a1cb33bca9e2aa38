package metrics

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Model names come from clients: past MaxModelLabels distinct names, new
// ones share the OtherModel series instead of growing the registry.
func TestModelLabelsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	for i := range MaxModelLabels + 50 {
		name := fmt.Sprintf("model-%d", i)
		m.RequestReceived(name, name, 0)
	}
	if n := testutil.CollectAndCount(m.requests); n != MaxModelLabels+1 {
		t.Fatalf("%d request series, want %d", n, MaxModelLabels+1)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues(OtherModel, OtherModel, "0")); got != 50 {
		t.Fatalf("other series counted %v, want 50", got)
	}
	m.RequestReceived("model-3", "model-3", 0) // a known name keeps its series
	if got := testutil.ToFloat64(m.requests.WithLabelValues("model-3", "model-3", "0")); got != 2 {
		t.Fatalf("known model counted %v, want 2", got)
	}
}
