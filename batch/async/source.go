package async

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/internal/promtext"
)

// Source is one reading a MetricGate turns into a budget.
type Source interface {
	Read(ctx context.Context) (float64, error)
}

// ErrNoSample reports a source with nothing to read (a query with an empty
// result, a metric missing from a page).
var ErrNoSample = errors.New("no sample")

// SourceFunc reads in-process: the benchmark's direct read of the
// picker's saturation detector.
type SourceFunc func(ctx context.Context) (float64, error)

// Read implements Source.
func (f SourceFunc) Read(ctx context.Context) (float64, error) { return f(ctx) }

// maxResponseBytes bounds a Prometheus answer or a scraped page.
const maxResponseBytes = 32 << 20

// PromQL evaluates an instant query against a Prometheus server's HTTP API.
// With several samples it reads the smallest (the tightest budget: kvgate's
// picker reports saturation per stage).
type PromQL struct {
	URL    string // Prometheus base URL
	Query  string
	Client *http.Client
}

// Read implements Source.
func (p *PromQL) Read(ctx context.Context) (float64, error) {
	u, err := url.JoinPath(p.URL, "/api/v1/query")
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"?"+url.Values{"query": {p.Query}}.Encode(), nil)
	if err != nil {
		return 0, err
	}
	body, err := get(p.Client, req)
	if err != nil {
		return 0, fmt.Errorf("prometheus query %q: %w", p.Query, err)
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Value [2]json.RawMessage `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, fmt.Errorf("prometheus query %q: %w", p.Query, err)
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("prometheus query %q: %s", p.Query, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return 0, fmt.Errorf("prometheus query %q: result type %q, want vector", p.Query, r.Data.ResultType)
	}
	best, n := math.Inf(1), 0
	for _, s := range r.Data.Result {
		var str string
		if err := json.Unmarshal(s.Value[1], &str); err != nil {
			return 0, fmt.Errorf("prometheus query %q: sample value: %w", p.Query, err)
		}
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return 0, fmt.Errorf("prometheus query %q: sample value: %w", p.Query, err)
		}
		if !math.IsNaN(v) {
			best, n = min(best, v), n+1
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("prometheus query %q: %w", p.Query, ErrNoSample)
	}
	return best, nil
}

func get(c *http.Client, req *http.Request) ([]byte, error) {
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxResponseBytes {
		return nil, fmt.Errorf("response over %d bytes", maxResponseBytes)
	}
	if resp.StatusCode/100 != 2 && !strings.Contains(resp.Header.Get("Content-Type"), "json") {
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return body, nil
}

// promSelector writes metric{k="v",...} with sorted, quoted labels.
func promSelector(metric string, labels map[string]string) string {
	if len(labels) == 0 {
		return metric
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Quote(labels[k])
	}
	return metric + "{" + strings.Join(parts, ",") + "}"
}

// Cascade reads its sources in order and returns the first reading.
type Cascade []Source

// Read implements Source.
func (c Cascade) Read(ctx context.Context) (float64, error) {
	var errs []error
	for _, s := range c {
		v, err := s.Read(ctx)
		if err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
			return v, nil
		}
		errs = append(errs, err)
	}
	return 0, fmt.Errorf("no source answered: %w", errors.Join(errs...))
}

// Cached keeps a source's last answer (value or error) for TTL, so that
// every poll of every queue does not query Prometheus
// (--prometheus-cache-ttl).
type Cached struct {
	Source Source
	TTL    time.Duration
	Now    func() time.Time

	mu   sync.Mutex
	at   time.Time
	v    float64
	err  error
	have bool
}

// Read implements Source.
func (c *Cached) Read(ctx context.Context) (float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.Now()
	if c.have && now.Sub(c.at) < c.TTL {
		return c.v, c.err
	}
	c.v, c.err = c.Source.Read(ctx)
	c.at, c.have = now, true
	return c.v, c.err
}

// Scrape reads one metric straight from a Prometheus text page (no
// Prometheus server): the largest value among the samples of Metric whose
// labels include Labels.
type Scrape struct {
	URL    string
	Metric string
	Labels map[string]string
	Client *http.Client
}

// Read implements Source.
func (s *Scrape) Read(ctx context.Context) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	body, err := get(s.Client, req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", s.URL, err)
	}
	best, ok, err := promtext.Max(body, s.Metric, func(m *dto.Metric) bool { return hasLabels(m, s.Labels) })
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", s.URL, err)
	}
	if !ok {
		return 0, fmt.Errorf("scrape %s: %s%v: %w", s.URL, s.Metric, s.Labels, ErrNoSample)
	}
	return best, nil
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	found := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			found++
		}
	}
	return found == len(want)
}

// oneMinus reads 1 − the source's value (saturation into budget space).
type oneMinus struct{ Source }

func (o oneMinus) Read(ctx context.Context) (float64, error) {
	v, err := o.Source.Read(ctx)
	return 1 - v, err
}
