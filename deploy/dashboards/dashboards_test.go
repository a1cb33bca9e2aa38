package dashboards

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

func TestParse(t *testing.T) {
	const in = `# title
prose | with a bar is ignored

## Dash One
source: somewhere

  - None | 
  [row] Pool
  - KV | sum by(name) (a_metric)
  - Latency | histogram_quantile(0.9, x_bucket) || histogram_quantile(0.5, x_bucket)
===== GIE tools/dashboards/x.json Dash Two
  - Rate | rate(y_total[5m])
`
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Panel{
		{Dashboard: "Dash One", Row: "Pool", Title: "KV", Exprs: []string{"sum by(name) (a_metric)"}, Line: 9},
		{Dashboard: "Dash One", Row: "Pool", Title: "Latency", Exprs: []string{"histogram_quantile(0.9, x_bucket)", "histogram_quantile(0.5, x_bucket)"}, Line: 10},
		{Dashboard: "GIE tools/dashboards/x.json Dash Two", Title: "Rate", Exprs: []string{"rate(y_total[5m])"}, Line: 12},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if _, err := Parse(strings.NewReader("## D\n  - a panel without queries\n")); err == nil {
		t.Fatal("a panel line without its separator was accepted")
	}
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by(pod) (rate(vllm:prompt_tokens_total{namespace=~"$namespace",model_name=~"m"}[5m]) + rate(vllm:generation_tokens_total{a="b"}[5m]))`,
			[]string{"vllm:prompt_tokens_total", "vllm:generation_tokens_total"}},
		{`histogram_quantile(0.99, sum by(le, plugin_type) (rate(inference_extension_plugin_duration_seconds_bucket{namespace=~"x"}[5m])))`,
			[]string{"inference_extension_plugin_duration_seconds_bucket"}},
		{`sum by (priority, fairness_id) (q_size) and on(priority, fairness_id) topk(10, sum by (priority, fairness_id) (max_over_time(q_size[$__range])))`,
			[]string{"q_size"}},
		{`1 - avg by(pod) (rate(it_count{x="or"}[5m]) > 0)`, []string{"it_count"}},
		{`(sum(tokens{endpoint_name=~".*prefill.*"}) / 33821) or vector(0)`, []string{"tokens"}},
		{`avg_over_time(up{job="epp"}[5m])`, []string{"up"}},
	} {
		if got := MetricNames(tc.expr); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("MetricNames(%s) = %v, want %v", tc.expr, got, tc.want)
		}
	}
}

func TestSubstitute(t *testing.T) {
	got, missing := Substitute(`rate(x{ns=~"$namespace",m="${model}"}[$__rate_interval]) $unknown $unknown`,
		map[string]string{"namespace": "n", "model": "m", "__rate_interval": "30s"})
	if got != `rate(x{ns=~"n",m="m"}[30s]) $unknown $unknown` || !reflect.DeepEqual(missing, []string{"unknown"}) {
		t.Fatalf("got %q, missing %v", got, missing)
	}
}

// Every expression of the real lists parses, names at least one metric and
// has a value for each of its template variables in the live test.
func TestRealListsParse(t *testing.T) {
	for _, path := range []string{filepath.Join(testutil.SharedDir(t), "DASHBOARDS.md"), filepath.Join("testdata", "autoscaling.md")} {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := Parse(strings.NewReader(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range ps {
			for _, e := range p.Exprs {
				n++
				if len(MetricNames(e)) == 0 {
					t.Errorf("%s / %s: no metric in %s", p.Dashboard, p.Title, e)
				}
			}
		}
		if n < 5 {
			t.Errorf("%s: only %d expressions", path, n)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("## D\n  [row] R\n  - T | a || b\n")
	f.Add("  - x |")
	f.Add("=====\n- | ||")
	f.Fuzz(func(t *testing.T, in string) {
		ps, err := Parse(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, p := range ps {
			if len(p.Exprs) == 0 {
				t.Fatalf("panel without queries returned: %+v", p)
			}
			for _, e := range p.Exprs {
				if e == "" || strings.Contains(e, exprSeparator) {
					t.Fatalf("bad query %q", e)
				}
				MetricNames(e)
			}
		}
	})
}
