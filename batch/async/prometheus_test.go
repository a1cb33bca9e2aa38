package async

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil/proctest"
)

// prometheusServer runs Debian's prometheus scraping target every second
// until the test ends; its base URL. Skipped without the binary unless
// KVGATE_REQUIRE_PROMETHEUS=1 (make test).
func prometheusServer(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("KVGATE_REQUIRE_PROMETHEUS") == "1" {
			t.Fatalf("prometheus not found: %v", err)
		}
		t.Skipf("prometheus not found (apt-get install prometheus): %v", err)
	}
	dir := t.TempDir()
	conf := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n- job_name: picker\n  static_configs:\n  - targets: [%q]\n", target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// Port 0: Prometheus logs the address it bound ("Listening on",
	// at level info), so no port is chosen and freed for it to race for.
	p, addr := proctest.Start(t, proctest.ListeningOn, nil, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:0", "--log.level=info")
	url := "http://" + addr
	for end := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get(url + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		if time.Now().After(end) {
			t.Fatalf("prometheus not ready:\n%s", p.Log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The Prometheus gates read a real Prometheus that scrapes a page with the
// picker's metric names: the saturation gauge, and the per-pod queue
// gauge prometheus-budget falls back to when the flow-control queue size
// is missing.
func TestPrometheusGates(t *testing.T) {
	var mu sync.Mutex
	page := `# TYPE inference_extension_flow_control_pool_saturation gauge
inference_extension_flow_control_pool_saturation{inference_pool="p",stage="decode"} 0.5
inference_extension_flow_control_pool_saturation{inference_pool="p",stage="effective"} 0.5
# TYPE inference_pool_per_pod_queue_size gauge
inference_pool_per_pod_queue_size{name="p",model_server_pod="a"} 40
inference_pool_per_pod_queue_size{name="p",model_server_pod="b"} 60
# TYPE inference_pool_ready_pods gauge
inference_pool_ready_pods{name="p"} 2
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, page)
	}))
	defer srv.Close()
	prom := prometheusServer(t, srv.Listener.Addr().String())
	f := &Factory{PrometheusURL: prom}
	build := func(typ string, params map[string]any) Gate {
		g, err := f.New(GateConfig{GateType: typ, GateParams: params})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	sat := build(GatePrometheusSaturation, map[string]any{"pool": "p", "threshold": "0.8"})
	budget := build(GatePrometheusBudget, map[string]any{"pool": "p", "max_concurrency": "100", "baseline": "0.05"})
	query := build(GatePrometheusQuery, map[string]any{"query": `1 - max(inference_extension_flow_control_pool_saturation{inference_pool="p"})`})
	missing := build(GatePrometheusSaturation, map[string]any{"pool": "absent", "fallback": "1"})
	// Wait for the first scrape to land.
	src := &PromQL{URL: prom, Query: "inference_pool_ready_pods"}
	for end := time.Now().Add(20 * time.Second); ; {
		if _, err := src.Read(context.Background()); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("prometheus never scraped the page")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		g    Gate
		want float64
	}{
		{"prometheus-saturation: (1 - 0.5) - (1 - 0.8)", sat, 0.3},
		// No flow-control queue series: the per-pod queue source, 1 - 50/100, less the baseline.
		{"prometheus-budget", budget, 0.45},
		{"prometheus-query", query, 0.5},
		{"no series: the fallback saturation 1", missing, 0},
	} {
		if got := tc.g.Budget(ctx); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: budget %v, want %v", tc.name, got, tc.want)
		}
	}
	// The pool saturates: the saturation gate closes at the next scrape.
	mu.Lock()
	page = `# TYPE inference_extension_flow_control_pool_saturation gauge
inference_extension_flow_control_pool_saturation{inference_pool="p",stage="effective"} 0.9
`
	mu.Unlock()
	for end := time.Now().Add(20 * time.Second); sat.Budget(ctx) != 0; {
		if time.Now().After(end) {
			t.Fatalf("budget %v after the pool saturated", sat.Budget(ctx))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
