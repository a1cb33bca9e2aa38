package scrape

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// reason classifies a failed scrape for the error counter.
type reason int

const (
	reasonRequest   reason = iota // the URL could not form a request
	reasonConnect                 // dial, reset, or a broken body
	reasonTimeout                 // Config.Timeout elapsed
	reasonStatus                  // not 200 OK
	reasonTooLarge                // page over MaxPageBytes
	reasonParse                   // malformed line the picker needed
	reasonNoMetrics               // no vLLM or SGLang load series
	numReasons
)

var reasonNames = [numReasons]string{"request", "connect", "timeout", "http_status", "too_large", "parse", "no_metrics"}

func (r reason) String() string { return reasonNames[r] }

// stats are pool-wide rather than per endpoint: the per-endpoint view is
// kvgate_endpoint_metrics_age_seconds, and counters per endpoint would
// leave stale series behind every pod churn.
type stats struct {
	scrapes atomic.Uint64
	errors  [numReasons]atomic.Uint64
	// lateTimeouts are timeouts noticed long after their deadline (the
	// picker ran late), not held against the server.
	lateTimeouts atomic.Uint64
}

var (
	scrapesDesc = prometheus.NewDesc("kvgate_endpoint_scrapes_total",
		"Metrics scrapes of the pool's model servers, successful or not.", []string{"name"}, nil)
	scrapeErrorsDesc = prometheus.NewDesc("kvgate_endpoint_scrape_errors_total",
		"Failed metrics scrapes of the pool's model servers, by reason.", []string{"name", "reason"}, nil)
	lateDesc = prometheus.NewDesc("kvgate_endpoint_scrape_late_timeouts_total",
		"Scrape timeouts noticed well after their deadline because the picker itself ran late; not counted against the server.", []string{"name"}, nil)
	loopsDesc = prometheus.NewDesc("kvgate_endpoint_scrape_loops",
		"Running scrape loops; equals the pool's endpoint count unless loops leak or lag.", []string{"name"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Scraper) Describe(ch chan<- *prometheus.Desc) {
	ch <- scrapesDesc
	ch <- scrapeErrorsDesc
	ch <- loopsDesc
	ch <- lateDesc
}

// Collect implements prometheus.Collector; the "name" label is Config.Pool.
func (s *Scraper) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(loopsDesc, prometheus.GaugeValue, float64(s.running.Load()), s.cfg.Pool)
	ch <- prometheus.MustNewConstMetric(scrapesDesc, prometheus.CounterValue, float64(s.stats.scrapes.Load()), s.cfg.Pool)
	ch <- prometheus.MustNewConstMetric(lateDesc, prometheus.CounterValue, float64(s.stats.lateTimeouts.Load()), s.cfg.Pool)
	for r := range numReasons {
		ch <- prometheus.MustNewConstMetric(scrapeErrorsDesc, prometheus.CounterValue,
			float64(s.stats.errors[r].Load()), s.cfg.Pool, r.String())
	}
}
