package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/demo/report"
	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
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
			m, err := scrapeSim(ctx, p.client, s.Addr)
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
		m, err := scrapeSim(ctx, c, s.Addr)
		if err != nil {
			continue
		}
		out[i] = counters{hits: m["vllm:prefix_cache_hits_total"], queries: m["vllm:prefix_cache_queries_total"],
			requests: m["vllm:request_success_total"], promptTokens: m["vllm:prompt_tokens_total"]}
	}
	return out
}

// Series the demo reads from the simulators.
var simSeries = []string{
	"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
	"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total", "vllm:prompt_tokens_total",
}

// scrapeSim fetches one simulator's /metrics page and sums each series the
// demo reads over its labels.
func scrapeSim(ctx context.Context, c *http.Client, addr string) (m map[string]float64, err error) {
	err = metricsPage(ctx, c, addr, func(r io.Reader) error {
		m, err = parseMetrics(r, simSeries...)
		return err
	})
	return m, err
}

// metricsPage GETs addr's /metrics and hands the page to read.
func metricsPage(ctx context.Context, c *http.Client, addr string, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("metrics %s: HTTP %d", addr, resp.StatusCode)
	}
	return read(io.LimitReader(resp.Body, maxMetricsBytes))
}

// parseMetrics sums the named series (without names, every series) of a
// page with the picker's own scrape parser.
func parseMetrics(r io.Reader, names ...string) (map[string]float64, error) {
	page, err := io.ReadAll(io.LimitReader(r, maxMetricsBytes))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	m, err := scrape.Sums(page, names...)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return m, nil
}
