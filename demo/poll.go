package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/demo/report"
)

// maxMetricsBytes bounds one /metrics answer.
const maxMetricsBytes = 4 << 20

// maxSamples bounds each endpoint's series (at 250 ms, over 30 minutes).
const maxSamples = 7200

// counters are the simulator counters a run reports as deltas.
type counters struct {
	hits, queries, requests, promptTokens float64
}

// poller samples every simulator's /metrics. Run owns the series until it
// returns; read them only afterwards.
type poller struct {
	client *http.Client
	sims   []Sim
	every  time.Duration

	mu     sync.Mutex
	series [][]report.Sample
}

func newPoller(sims []Sim, every time.Duration) *poller {
	return &poller{client: &http.Client{Timeout: 2 * time.Second}, sims: sims, every: every, series: make([][]report.Sample, len(sims))}
}

// run samples until ctx ends; a failed scrape (a sim killed on purpose,
// say) leaves a gap rather than ending the run.
func (p *poller) run(ctx context.Context, start time.Time) {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		for i, s := range p.sims {
			m, err := scrape(ctx, p.client, s.Addr)
			if err != nil {
				continue
			}
			p.mu.Lock()
			if len(p.series[i]) < maxSamples {
				p.series[i] = append(p.series[i], report.Sample{
					T: time.Since(start), Waiting: m["vllm:num_requests_waiting"], Running: m["vllm:num_requests_running"],
					KVUsage: m["vllm:kv_cache_usage_perc"],
				})
			}
			p.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *poller) samples(i int) []report.Sample {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]report.Sample(nil), p.series[i]...)
}

// readCounters reads each simulator's counters; a simulator that does not
// answer reads as zeros.
func readCounters(ctx context.Context, c *http.Client, sims []Sim) []counters {
	out := make([]counters, len(sims))
	for i, s := range sims {
		m, err := scrape(ctx, c, s.Addr)
		if err != nil {
			continue
		}
		out[i] = counters{hits: m["vllm:prefix_cache_hits_total"], queries: m["vllm:prefix_cache_queries_total"],
			requests: m["vllm:request_success_total"], promptTokens: m["vllm:prompt_tokens_total"]}
	}
	return out
}

// scrape fetches one /metrics page and sums each family over its labels.
func scrape(ctx context.Context, c *http.Client, addr string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: HTTP %d", addr, resp.StatusCode)
	}
	return parseMetrics(io.LimitReader(resp.Body, maxMetricsBytes))
}

// parseMetrics sums gauges and counters per family name.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	out := make(map[string]float64, len(fams))
	for name, f := range fams {
		var sum float64
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				sum += m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				sum += m.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				sum += m.GetUntyped().GetValue()
			}
		}
		out[name] = sum
	}
	return out, nil
}
