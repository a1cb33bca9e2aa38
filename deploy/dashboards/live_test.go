package dashboards

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// testNamespace and the other values stand in for a dashboard's template
// variables; the scrape configuration gives the targets the same labels a
// Kubernetes scrape would.
const (
	testNamespace = "llm-d-test"
	eppJob        = "gaie-optimized-baseline-epp" // the job the llm-d failure dashboard names
	eppService    = "gaie-optimized-baseline-epp"
)

// minWithData is the share of the expressions that must return data.
const minWithData = 0.95

// trivialFallback is the "or vector(0)" a query ends with so that it never
// returns nothing; the check evaluates the query without it.
var trivialFallback = regexp.MustCompile(`\s+or\s+vector\(0\)\s*$`)

// checkedExpr is one query and what came of it.
type checkedExpr struct {
	panel  Panel
	expr   string
	result queryResult
	err    error
	reason string
}

func loadPanels(t *testing.T) []Panel {
	t.Helper()
	var all []Panel
	// kvgate's GPU dashboard, whose metrics this fleet's agent serves (the
	// network dashboard has its own live check, network_live_test.go).
	for _, path := range []string{filepath.Join(grafanaDir, "kvgate-gpu.json")} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := ParseGrafana(f)
		f.Close()
		if err != nil || len(ps) == 0 {
			t.Fatalf("%s: %d panels, %v", path, len(ps), err)
		}
		all = append(all, ps...)
	}
	for _, path := range []string{filepath.Join(testutil.SharedDir(t), "DASHBOARDS.md"), filepath.Join("testdata", "autoscaling.md")} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := Parse(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(ps) == 0 {
			t.Fatalf("%s: no panels", path)
		}
		all = append(all, ps...)
	}
	return all
}

// modelServerDeployment names the fleet's model servers as the autoscaling
// panels' $model_server_deployment selects them.
const modelServerDeployment = "vllm"

// TestDashboardsOnLiveFleet is the compatibility check of the dashboards
// users already have: every expression is evaluated by a real Prometheus
// that scraped a kvgate fleet under load.
func TestDashboardsOnLiveFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet and prometheus; skipped with -short")
	}
	bin := prometheusBinary(t)
	panels := loadPanels(t)
	tokDir := testutil.TokenizerDir(t)

	f := startFleet(t, tokDir, 3, 0.1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Beside it: the async processor feeding the fleet from Redis, and a
	// P/D pool of its own.
	asy := startAsync(ctx, t, f)
	pd := startPD(ctx, t, tokDir)
	targets := append(f.targets(), pd.targets()...)
	targets = append(targets, scrapeTarget{Job: "llm-d-async", Addr: asy.metrics, Labels: map[string]string{
		"namespace": testNamespace, "pod": "llm-d-async-0",
	}})
	// The node agent of a GPU node, for kvgate's GPU dashboard.
	targets = append(targets, scrapeTarget{Job: "kvgate-agent", Addr: startGPUAgent(t), Labels: map[string]string{
		"namespace": testNamespace, "node": "gpu-node-0",
	}})
	// kube-state-metrics over a real API server holding the model servers'
	// Deployment, for the autoscaling panels' kube_deployment_* reads.
	if ksm := kubeStateMetricsBinary(t); ksm != "" {
		targets = append(targets, startKubeStateMetrics(t, ksm, []string{modelServerDeployment}))
	}
	prom := startPrometheus(t, bin, targets)

	if err := prom.awaitHealthy(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	loadStart := time.Now()
	var (
		wg           sync.WaitGroup
		pdRes        *loadResult
		asyncRes     *asyncResult
		bodyStatuses map[int]int
	)
	wg.Go(func() { pdRes = pd.load(ctx, 2, 30, 6*time.Second, 40*time.Second, 0) })
	wg.Go(func() { asyncRes = asy.load(ctx, 3, 30, 10) })
	wg.Go(func() { bodyStatuses = f.modelessRequests(ctx, 3) })
	res := f.load(ctx, 6, 150, 6*time.Second, 40*time.Second, 10)
	wg.Wait()
	t.Logf("load: statuses %v, transport errors %d, bodies %v", res.status, res.errors, res.sample)
	t.Logf("P/D load: statuses %v, transport errors %d, bodies %v", pdRes.status, pdRes.errors, pdRes.sample)
	t.Logf("async: %d ok, %d failed, %d errors; requests without a usable model: %v",
		asyncRes.ok.Load(), asyncRes.failed.Load(), asyncRes.errs.Load(), bodyStatuses)
	if res.status[200] < 50 || res.status[404] == 0 {
		t.Fatalf("load: want at least 50 successes and some 404s, got %v (%v)", res.status, res.sample)
	}
	if pdRes.status[200] < 10 {
		t.Fatalf("P/D load: want at least 10 successes, got %v (%v)", pdRes.status, pdRes.sample)
	}
	if asyncRes.ok.Load() < 10 || asyncRes.failed.Load() == 0 || asyncRes.errs.Load() != 0 {
		t.Fatalf("async load: %d ok, %d failed (the unknown model's), %d errors", asyncRes.ok.Load(), asyncRes.failed.Load(), asyncRes.errs.Load())
	}
	// Two scrapes after the load, so that the last samples are in.
	if err := prom.awaitHealthy(ctx, time.Now().Add(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	names, err := prom.metricNames(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Grafana's $__rate_interval and $__range: a window that covers the
	// whole load, however long a busy machine made it.
	window := fmt.Sprintf("%ds", int(time.Since(loadStart).Seconds())+10)
	vars := map[string]string{
		"namespace": testNamespace, "model_name": fleetModel, "model": fleetModel,
		"__rate_interval": window, "__range": window,
		"node": ".*", "pool": f.poolName, "epp": eppService, "epp_service": eppService, "model_server_deployment": modelServerDeployment,
	}
	var checked []checkedExpr
	for _, p := range panels {
		for _, e := range p.Exprs {
			q, missing := Substitute(e, vars)
			if len(missing) > 0 {
				t.Fatalf("%s / %s: no value for template variables %v", p.Dashboard, p.Title, missing)
			}
			q = trivialFallback.ReplaceAllString(q, "")
			c := checkedExpr{panel: p, expr: q}
			c.result, c.err = prom.query(ctx, q)
			if c.err == nil && c.result.Valued == 0 {
				var absent []string
				for _, n := range MetricNames(q) {
					if !names[n] {
						absent = append(absent, n)
					}
				}
				c.reason = explainFor(q, absent, true) // the P/D pool runs
			}
			checked = append(checked, c)
		}
	}

	withData, accepted := 0, 0
	var failures []string
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "dashboard\tpanel\treason\texpression")
	for _, c := range checked {
		switch {
		case c.err != nil:
			failures = append(failures, fmt.Sprintf("%s / %s: %v: %s", c.panel.Dashboard, c.panel.Title, c.err, c.expr))
		case c.result.Valued > 0:
			withData++
		case c.reason != "":
			accepted++
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.panel.Dashboard, c.panel.Title, c.reason, short(c.expr))
		default:
			var absent []string
			for _, n := range MetricNames(c.expr) {
				if !names[n] {
					absent = append(absent, n)
				}
			}
			why := "metrics present, selection empty"
			if len(absent) > 0 {
				why = "absent: " + strings.Join(absent, ", ")
			}
			fmt.Fprintf(tw, "%s\t%s\tUNEXPLAINED (%s)\t%s\n", c.panel.Dashboard, c.panel.Title, why, short(c.expr))
			failures = append(failures, fmt.Sprintf("%s / %s (%s): %s", c.panel.Dashboard, c.panel.Title, why, c.expr))
		}
	}
	_ = tw.Flush()
	t.Log("expressions returning nothing:\n" + table.String())
	total := len(checked)
	t.Logf("expressions with data: %d of %d (%.1f%%); empty with an accepted reason: %d; unexplained or failed: %d",
		withData, total, 100*float64(withData)/float64(total), accepted, len(failures))
	logReasonTotals(t, checked)
	// The figure issue 14 asks for: at least 95% of the expressions return
	// data; the rest are in the table above with their reasons.
	if ratio := float64(withData) / float64(total); ratio < minWithData {
		t.Errorf("%d of %d expressions (%.1f%%) return data, want at least %.0f%%", withData, total, 100*ratio, 100*minWithData)
	}
	// Beyond the dashboards: the KV index metrics (no dashboard reads them
	// yet) show the servers' KV events reaching the picker's index and the
	// precise scorer looking it up.
	for _, q := range []string{
		`llm_d_epp_kv_cache_index_admissions_total > 0`,
		`llm_d_epp_kv_cache_index_lookup_requests_total > 0`,
		`llm_d_epp_kv_cache_index_lookup_hits_total > 0`,
		`kvcache_index_lookup_requests_total > 0`,
		// The gateway's body-based routing saw each outcome.
		`bbr_success_total > 0`, `bbr_model_not_in_body_total > 0`, `bbr_model_not_parsed_total > 0`,
		// The P/D pool's KV moved between the agents.
		`sum(vllm:nixl_xfer_time_seconds_count{pod=~".*decode.*"}) > 0`,
		// The async processor's fatal 404s (the unknown model's).
		`sum(llm_d_async_async_failed_requests_total{queue_name="` + asyncQueue + `"}) > 0`,
		`sum by (error_code) (llm_d_epp_request_error_total{error_code="ModelServerError"}) > 0`,
	} {
		if r, err := prom.query(ctx, q); err != nil || r.Valued == 0 {
			t.Errorf("%s: nothing (%v)", q, err)
		}
	}
	for _, fl := range failures {
		t.Errorf("returns nothing without an accepted reason: %s", fl)
	}
}

// targets are the fleet's scrape targets, labelled as a Kubernetes scrape
// of llm-d's optimized-baseline would label them.
func (f *fleet) targets() []scrapeTarget {
	targets := []scrapeTarget{{Job: eppJob, Addr: f.eppMetrics, Labels: map[string]string{
		"namespace": testNamespace, "pod": "gaie-optimized-baseline-epp-0", "service": eppService,
		"top_level_controller_name": eppService,
	}}, {Job: "inference-gateway", Addr: f.gatewayMetrics, Labels: map[string]string{
		"namespace": testNamespace, "pod": "inference-gateway-0",
	}}}
	for i, s := range f.sims {
		targets = append(targets, scrapeTarget{Job: "vllm", Addr: s.Addr().String(), Labels: map[string]string{
			"namespace": testNamespace, "pod": f.simNames[i],
		}})
	}
	return targets
}

// logReasonTotals counts the accepted empty expressions per reason.
func logReasonTotals(t *testing.T, checked []checkedExpr) {
	n := map[string]int{}
	for _, c := range checked {
		if c.err == nil && c.result.Valued == 0 && c.reason != "" {
			n[c.reason]++
		}
	}
	var keys []string
	for k := range n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("  %3d  %s", n[k], k)
	}
}

func short(s string) string {
	if len(s) > 140 {
		return s[:137] + "..."
	}
	return s
}
