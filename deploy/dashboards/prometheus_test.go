package dashboards

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/testutil/proctest"
)

// RequirePrometheusEnv makes a missing prometheus binary fail the test
// instead of skipping it: `make test` sets it after `make setup` installed
// the Debian package.
const RequirePrometheusEnv = "KVGATE_REQUIRE_PROMETHEUS"

// prometheusBinary finds Debian's prometheus, or skips (fails when
// RequirePrometheusEnv=1).
func prometheusBinary(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv(RequirePrometheusEnv) == "1" {
			t.Fatalf("prometheus not found (%s=1; `make setup` installs the Debian package): %v", RequirePrometheusEnv, err)
		}
		t.Skipf("prometheus not found (apt-get install prometheus, or make setup): %v", err)
	}
	return p
}

// scrapeTarget is one static target with the labels a Kubernetes scrape
// would give it.
type scrapeTarget struct {
	Job    string
	Addr   string
	Labels map[string]string
}

// prometheus is a running Prometheus server.
type prometheus struct {
	url string
	log *testutil.SyncBuffer
}

// startPrometheus runs bin scraping targets every second, and evaluating
// the rule files given, until the test ends.
func startPrometheus(t *testing.T, bin string, targets []scrapeTarget, ruleFiles ...string) *prometheus {
	t.Helper()
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n")
	if len(ruleFiles) > 0 {
		cfg.WriteString("rule_files:\n")
		for _, f := range ruleFiles {
			fmt.Fprintf(&cfg, "  - %q\n", f)
		}
	}
	cfg.WriteString("scrape_configs:\n")
	byJob := map[string][]scrapeTarget{}
	var jobs []string
	for _, tg := range targets {
		if _, ok := byJob[tg.Job]; !ok {
			jobs = append(jobs, tg.Job)
		}
		byJob[tg.Job] = append(byJob[tg.Job], tg)
	}
	for _, job := range jobs {
		fmt.Fprintf(&cfg, "  - job_name: %q\n    static_configs:\n", job)
		for _, tg := range byJob[job] {
			fmt.Fprintf(&cfg, "      - targets: [%q]\n        labels:\n", tg.Addr)
			for k, v := range tg.Labels {
				fmt.Fprintf(&cfg, "          %s: %q\n", k, v)
			}
		}
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// Port 0: Prometheus logs the address it bound, so no port is chosen
	// and freed for another process to take first.
	proc, addr := proctest.Start(t, proctest.ListeningOn, nil, bin, "--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:0", "--log.level=info")
	p := &prometheus{url: "http://" + addr, log: proc.Log}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready: %v\n%s", err, p.log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// apiResponse is the envelope of Prometheus's HTTP API.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

func (p *prometheus) get(ctx context.Context, path string, q url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: HTTP %d: %w", path, resp.StatusCode, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, env.ErrorType, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// queryResult is what one instant query returned.
type queryResult struct {
	Series int // samples in the result
	Valued int // samples whose value is a number (not NaN)
}

// query evaluates expr at now. A scalar counts as one sample.
func (p *prometheus) query(ctx context.Context, expr string) (queryResult, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return queryResult{}, err
	}
	var values []string
	switch data.ResultType {
	case "vector":
		var v []struct {
			Value [2]any `json:"value"`
		}
		if err := json.Unmarshal(data.Result, &v); err != nil {
			return queryResult{}, err
		}
		for _, s := range v {
			str, _ := s.Value[1].(string)
			values = append(values, str)
		}
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(data.Result, &v); err != nil {
			return queryResult{}, err
		}
		str, _ := v[1].(string)
		values = append(values, str)
	default:
		return queryResult{}, fmt.Errorf("unexpected result type %q", data.ResultType)
	}
	r := queryResult{Series: len(values)}
	for _, s := range values {
		if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) {
			r.Valued++
		}
	}
	return r, nil
}

// metricNames lists every metric name Prometheus holds.
func (p *prometheus) metricNames(ctx context.Context) (map[string]bool, error) {
	var names []string
	if err := p.get(ctx, "/api/v1/label/__name__/values", url.Values{}, &names); err != nil {
		return nil, err
	}
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m, nil
}

// awaitScrapes waits until every target has been scraped successfully at
// least n times after since (Prometheus reports the last scrape only, so it
// waits n scrape intervals past since with all targets up).
func (p *prometheus) awaitHealthy(ctx context.Context, since time.Time) error {
	for {
		var data struct {
			ActiveTargets []struct {
				Health     string    `json:"health"`
				LastScrape time.Time `json:"lastScrape"`
				LastError  string    `json:"lastError"`
				ScrapeURL  string    `json:"scrapeUrl"`
			} `json:"activeTargets"`
		}
		if err := p.get(ctx, "/api/v1/targets", url.Values{"state": {"active"}}, &data); err != nil {
			return err
		}
		ok := len(data.ActiveTargets) > 0
		var bad bytes.Buffer
		for _, tg := range data.ActiveTargets {
			if tg.Health != "up" || tg.LastScrape.Before(since) {
				ok = false
				fmt.Fprintf(&bad, "%s: %s %s (last %s); ", tg.ScrapeURL, tg.Health, tg.LastError, tg.LastScrape.Format(time.RFC3339Nano))
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("targets not scraped: %s: %w", bad.String(), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
