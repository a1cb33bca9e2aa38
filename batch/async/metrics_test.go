package async

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testutil"
)

// Every llm_d_async series of llm-d-async's Grafana dashboard (its queries
// as shared/DASHBOARDS.md records them) is exported, but the Pub/Sub-only
// message latency, which llm-d-async's sorted-set transport does not
// register either.
func TestDashboardSeriesExported(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testutil.SharedDir(t), "DASHBOARDS.md"))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	q := m.queue("q", "q", DefaultWorkerPool)
	q.inference.Observe(1)
	q.residence.Observe(1)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range fams {
		have[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			have[f.GetName()+"_bucket"] = true
		}
	}
	names := regexp.MustCompile(`llm_d_async_[a-z_]+`).FindAllString(string(raw), -1)
	if len(names) == 0 {
		t.Fatal("no llm_d_async series in DASHBOARDS.md")
	}
	for _, n := range names {
		if strings.HasPrefix(n, MetricPrefix+"message_latency_time_millis") {
			continue
		}
		if !have[n] {
			t.Errorf("dashboard series %s is not exported", n)
		}
	}
}
