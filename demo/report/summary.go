package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/demo/workload"
)

// Sample is one reading of an endpoint's load.
type Sample struct {
	T       time.Duration `json:"t_ns"`
	Waiting float64       `json:"waiting"`
	Running float64       `json:"running"`
	KVUsage float64       `json:"kv_usage"`
}

// Endpoint is what one model server reported over a run: counter deltas
// and its load over time.
type Endpoint struct {
	Name         string   `json:"name"`
	Requests     float64  `json:"requests"`
	PromptTokens float64  `json:"prompt_tokens"`
	CacheHits    float64  `json:"prefix_cache_hits"`
	CacheQueries float64  `json:"prefix_cache_queries"`
	Samples      []Sample `json:"samples"`
}

// Run is one policy's replay.
type Run struct {
	Policy    string            `json:"policy"`
	Wall      time.Duration     `json:"wall_ns"`
	Results   []workload.Result `json:"results"`
	Endpoints []Endpoint        `json:"endpoints"`
}

// Summary is a run's headline numbers.
type Summary struct {
	Policy   string `json:"policy"`
	Requests int    `json:"requests"`
	Errors   int    `json:"errors"`
	// TTFT percentiles in seconds, over successful requests.
	TTFTP50 float64 `json:"ttft_p50_s"`
	TTFTP90 float64 `json:"ttft_p90_s"`
	TTFTP99 float64 `json:"ttft_p99_s"`
	// RequestsPerSec and OutputTokensPerSec count successful requests from
	// the start of the replay to the last successful completion.
	RequestsPerSec     float64 `json:"requests_per_s"`
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	// HitRate is the servers' prefix-cache hits / queries, in tokens.
	HitRate float64 `json:"prefix_cache_hit_rate"`
	// ClientCachedRate is cached_tokens / prompt_tokens from the usage
	// records, the client's view of the same thing.
	ClientCachedRate float64 `json:"client_cached_rate"`
	// Share is each endpoint's fraction of the completed requests.
	Share []float64 `json:"share"`
}

// Summarize computes a run's summary.
func Summarize(r Run) Summary {
	s := Summary{Policy: r.Policy, Requests: len(r.Results)}
	var ttfts []float64
	var out, prompt, cached int
	for _, res := range r.Results {
		if !res.OK() {
			s.Errors++
			continue
		}
		ttfts = append(ttfts, res.TTFT.Seconds())
		out += res.CompletionTokens
		prompt += res.PromptTokens
		cached += res.CachedTokens
	}
	slices.Sort(ttfts)
	if len(ttfts) > 0 { // zeros otherwise: JSON has no NaN
		s.TTFTP50, s.TTFTP90, s.TTFTP99 = Percentile(ttfts, 0.5), Percentile(ttfts, 0.9), Percentile(ttfts, 0.99)
	}
	// Throughput counts up to the last successful completion, so that a
	// failed request that hung until a timeout does not dilute it.
	var span time.Duration
	for _, res := range r.Results {
		if res.OK() {
			span = max(span, res.Sent+res.Latency)
		}
	}
	if span == 0 {
		span = r.Wall
	}
	if secs := span.Seconds(); secs > 0 {
		s.RequestsPerSec = float64(len(ttfts)) / secs
		s.OutputTokensPerSec = float64(out) / secs
	}
	if prompt > 0 {
		s.ClientCachedRate = float64(cached) / float64(prompt)
	}
	var hits, queries, reqs float64
	for _, e := range r.Endpoints {
		hits += e.CacheHits
		queries += e.CacheQueries
		reqs += e.Requests
	}
	if queries > 0 {
		s.HitRate = hits / queries
	}
	for _, e := range r.Endpoints {
		share := 0.0
		if reqs > 0 {
			share = e.Requests / reqs
		}
		s.Share = append(s.Share, share)
	}
	return s
}

// Percentile is the nearest-rank percentile of sorted values; NaN when
// there are none.
func Percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// WriteTable prints the comparison table.
func WriteTable(w io.Writer, sums []Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tok/sent\tTTFT p50\tp90\tp99\treq/s\tout tok/s\tcache hit\tload spread (share per sim)\t")
	for _, s := range sums {
		shares := make([]string, len(s.Share))
		for i, v := range s.Share {
			shares[i] = fmt.Sprintf("%.0f%%", 100*v)
		}
		p50, p90, p99 := "-", "-", "-"
		if s.Requests > s.Errors {
			p50, p90, p99 = Millis(s.TTFTP50), Millis(s.TTFTP90), Millis(s.TTFTP99)
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%.1f\t%.0f\t%.1f%%\t%s\t\n", s.Policy, s.Requests-s.Errors, s.Requests,
			p50, p90, p99, s.RequestsPerSec, s.OutputTokensPerSec, 100*s.HitRate, strings.Join(shares, " "))
	}
	return tw.Flush()
}

// Millis formats seconds as whole milliseconds.
func Millis(sec float64) string {
	return fmt.Sprintf("%.0f ms", 1000*sec)
}
