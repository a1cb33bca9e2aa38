package dashboards

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseGrafana(t *testing.T) {
	const in = `{"title": "D", "panels": [
		{"type": "timeseries", "title": "top", "targets": [{"expr": "a"}]},
		{"type": "row", "title": "R1", "collapsed": false, "panels": []},
		{"type": "stat", "title": "in R1", "targets": [{"expr": "b"}, {"expr": " c "}]},
		{"type": "text", "title": "notes"},
		{"type": "row", "title": "R2", "collapsed": true, "panels": [
			{"type": "timeseries", "title": "hidden", "targets": [{"expr": "d"}]}]}]}`
	got, err := ParseGrafana(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Panel{
		{Dashboard: "D", Title: "top", Exprs: []string{"a"}},
		{Dashboard: "D", Row: "R1", Title: "in R1", Exprs: []string{"b", "c"}},
		{Dashboard: "D", Row: "R2", Title: "hidden", Exprs: []string{"d"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{`{"panels": []}`, `{"title": "D", "panels": [{"title": "x", "targets": [{"refId": "A"}]}]}`, `[`} {
		if _, err := ParseGrafana(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// grafanaDir holds kvgate's Grafana dashboards: in the Helm chart, which
// provisions them as ConfigMaps (a chart reads only its own files).
var grafanaDir = filepath.Join("..", "helm", "kvgate", "dashboards")

// TestGrafanaDashboardsParse: every shipped dashboard parses; the network
// and GPU ones name only the agent's metrics (the live checks evaluate
// them).
func TestGrafanaDashboardsParse(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(grafanaDir, "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no dashboards in %s: %v", grafanaDir, err)
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := ParseGrafana(f)
		f.Close()
		if err != nil || len(ps) == 0 {
			t.Fatalf("%s: %d panels, %v", p, len(ps), err)
		}
		prefix, ok := map[string]string{"kvgate-network.json": "kvgate_netobs_", "kvgate-gpu.json": "kvgate_gpu_"}[filepath.Base(p)]
		if !ok {
			continue
		}
		for _, panel := range ps {
			for _, e := range panel.Exprs {
				for _, m := range MetricNames(e) {
					if !strings.HasPrefix(m, prefix) {
						t.Errorf("%s / %s: metric %q is not kvgate's", p, panel.Title, m)
					}
				}
			}
		}
	}
}

func FuzzParseGrafana(f *testing.F) {
	f.Add(`{"title": "D", "panels": [{"type": "row", "title": "r", "panels": [{"title": "p", "targets": [{"expr": "x"}]}]}]}`)
	f.Add(`{"title": 1}`)
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := ParseGrafana(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, p := range ps {
			if len(p.Exprs) == 0 || slices.Contains(p.Exprs, "") {
				t.Fatalf("panel without queries, or an empty one, returned: %+v", p)
			}
			for _, e := range p.Exprs {
				MetricNames(e)
			}
		}
	})
}
