package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/testutil/proctest"
)

// startPrometheus runs a real Prometheus scraping target every 500ms and
// returns its base URL.
func startPrometheus(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed (Debian package prometheus; make setup installs it)")
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 500ms\n  scrape_timeout: 500ms\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: epp\n  static_configs:\n  - targets: [%q]\n", target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// Port 0: Prometheus logs the address it bound, so no port is chosen
	// and freed for another process to take first.
	_, addr := proctest.Start(t, proctest.ListeningOn, nil, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:0", "--log.level=info")
	base := "http://" + addr
	testutil.WaitFor(t, "prometheus ready", func() bool {
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base
}

// query evaluates expr now and returns the number of series.
func query(t *testing.T, base, expr string) int {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.Status != "success" {
		t.Fatalf("%s: %s", expr, r.Error)
	}
	return len(r.Data.Result)
}

// The flow-control row of the GIE dashboard returns data from a picker
// queueing real traffic, scraped by a real Prometheus.
func TestFlowControlDashboardPanels(t *testing.T) {
	f := startFleet(t, flowControlConfig, vllmMetrics(0, 0, ""))
	metricsURL, _ := url.Parse(f.metrics)
	prom := startPrometheus(t, metricsURL.Host)
	// Prometheus hands discovered targets to its scrapers every 5 s.
	for deadline := time.Now().Add(time.Minute); query(t, prom, `up{job="epp"} == 1`) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("prometheus never scraped the picker")
		}
	}

	// Three clients against a server that takes one request at a time:
	// requests queue, dispatch as responses end, and some expire.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				s := envoytest.Open(t, f.client)
				if s.Stream.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions")) != nil ||
					s.Stream.Send(envoytest.RequestBody([]byte(completion), true)) != nil {
					return
				}
				r, err := s.Stream.Recv()
				if err != nil {
					return
				}
				if r.GetImmediateResponse() == nil {
					time.Sleep(30 * time.Millisecond)
					_ = s.Stream.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"))
					_, _ = s.Stream.Recv()
					_ = s.Stream.Send(envoytest.ResponseBody([]byte(`{}`), true))
					_, _ = s.Stream.Recv()
				}
				s.Cancel()
			}
		}()
	}
	wg.Wait()

	data, err := os.ReadFile(filepath.Join("testdata", "flow-control-panels.txt"))
	if err != nil {
		t.Fatal(err)
	}
	panels := 0
	for _, line := range strings.Split(string(data), "\n") {
		title, exprs, ok := strings.Cut(line, " | ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		panels++
		// A scrape a loaded machine let time out marks the series stale
		// until the next one: a panel gets a few seconds to show data.
		got := 0
		for deadline := time.Now().Add(20 * time.Second); got == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			for _, e := range strings.Split(exprs, " || ") {
				e = strings.NewReplacer("$__rate_interval", "15s", "$__range", "30s").Replace(e)
				got += query(t, prom, e)
			}
		}
		if got == 0 {
			t.Errorf("panel %q returns no data", title)
		}
	}
	if panels != 9 {
		t.Fatalf("read %d panels", panels)
	}
}
