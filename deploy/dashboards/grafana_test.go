package dashboards

import (
	"os"
	"path/filepath"
	"reflect"
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

// TestGrafanaDashboardsParse: every shipped dashboard parses; the network
// one names only the agent's metrics (the live check evaluates them).
func TestGrafanaDashboardsParse(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("grafana", "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no dashboards in grafana/: %v", err)
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
		if filepath.Base(p) != "kvgate-network.json" {
			continue
		}
		for _, panel := range ps {
			for _, e := range panel.Exprs {
				for _, m := range MetricNames(e) {
					if !strings.HasPrefix(m, "kvgate_netobs_") {
						t.Errorf("%s / %s: metric %q is not kvgate's", p, panel.Title, m)
					}
				}
			}
		}
	}
}
