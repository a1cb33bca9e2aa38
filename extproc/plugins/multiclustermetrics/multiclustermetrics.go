// Package multiclustermetrics holds llm-d's multi-cluster data-layer pair,
// for a cluster-scoped picker whose endpoints are peer clusters (each one
// the gateway of a cluster with its own picker).
//
// multicluster-metrics-data-source polls each cluster's metrics page
// (the remote picker's own /metrics), GET <scheme>://<host><path>, every
// interval. The host is the endpoint's address, or, when the endpoint has
// the label metricsAddress, that host with the port of the label
// metricsPort (default: the endpoint's port). Unlike metrics-data-source
// it defaults to https with the certificate verified (the scrape crosses a
// cluster boundary), and it reads at most 8 MiB of a page. It does not
// feed kvgate's per-pod scraper: its pages go only to the extractor wired
// under it.
//
// multicluster-metrics-extractor reads a page's pool aggregates, by default
// llm_d_epp_average_kv_cache_utilization and llm_d_epp_average_queue_size,
// into the endpoint's attributes KVCacheUtilization and QueueSize (llm-d's
// llm-d.ai/multicluster-kv-cache-utilization and
// llm-d.ai/multicluster-queue-size), which the multicluster scorers read.
// Of a metric's matching samples the largest is taken (a picker exports
// one series per pool). As in llm-d, a page without the metric, or a failed
// poll, keeps the previous value; a cluster leaving the pool loses its
// values.
//
// The parameters are documented on Source and Extractor.
package multiclustermetrics

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/poll"
	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
	"github.com/kvgate/kvgate/extproc/plugins/metricsdatasource"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/promtext"
)

// Registered plugin types.
const (
	SourceType    = "multicluster-metrics-data-source"
	ExtractorType = "multicluster-metrics-extractor"
)

// Attributes the extractor publishes.
const (
	KVCacheUtilization = "KVCacheUtilization"
	QueueSize          = "QueueSize"
)

// Defaults (llm-d's).
const (
	DefaultKVCacheUtilizationMetric = "llm_d_epp_average_kv_cache_utilization"
	DefaultQueueSizeMetric          = "llm_d_epp_average_queue_size"
	// MaxPageBytes bounds one page from a peer cluster.
	MaxPageBytes = 8 << 20
	// Labels naming a separate metrics host and port.
	MetricsAddressLabel = "metricsAddress"
	MetricsPortLabel    = "metricsPort"
)

// Source implements multicluster-metrics-data-source.
//
// Parameters (llm-d's names and defaults):
//
//	scheme: string            "https" (default) or "http"
//	path: string              default "/metrics"
//	insecureSkipVerify: bool  do not verify the cluster's certificate
//	                          (default false)
//	caCertPath: string        PEM CA bundle that verifies it
//	clientCertPath: string    client certificate (PEM) for mTLS; set with
//	                          clientKeyPath
//	clientKeyPath: string     its private key (PEM)
//	interval: duration        poll period, rounded to a multiple of
//	                          --refresh-metrics-interval (default: that
//	                          interval)
type Source struct {
	scheduling.Named
	metricsdatasource.Polling
	scheme, path string
}

// NewSource is multicluster-metrics-data-source's factory.
func NewSource(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p metricsdatasource.Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	p.Scheme = cmp.Or(p.Scheme, "https")
	if p.InsecureSkipVerify == nil {
		verify := false
		p.InsecureSkipVerify = &verify
	}
	shared, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	target, interval, err := metricsdatasource.HTTPTarget(shared, "/metrics")
	if err != nil {
		return nil, err
	}
	s := &Source{Named: scheduling.NewNamed(SourceType, name), scheme: target.Scheme, path: target.Path}
	s.Interval = interval
	var log *slog.Logger
	if h != nil {
		log = h.Log
	}
	s.Poller = poll.New(SourceType, func(e *endpoints.Endpoint) string { return s.URL(e) }, target.TLS, log)
	s.Poller.Limit = MaxPageBytes
	return s, nil
}

// URL is e's metrics page: at its metricsAddress (and metricsPort) labels
// when it has them, else at its address.
func (s *Source) URL(e *endpoints.Endpoint) string {
	host := e.Address()
	if a := e.Label(MetricsAddressLabel); a != "" {
		_, port, err := net.SplitHostPort(e.Address())
		if err != nil {
			port = ""
		}
		host = net.JoinHostPort(a, cmp.Or(e.Label(MetricsPortLabel), port))
	}
	return s.scheme + "://" + host + s.path
}

// ExtractorParams are multicluster-metrics-extractor's parameters.
type ExtractorParams struct {
	KVCacheUtilizationMetric string `json:"kvCacheUtilizationMetric"`
	QueueSizeMetric          string `json:"queueSizeMetric"`
}

// Extractor implements multicluster-metrics-extractor.
//
// Parameters (llm-d's names):
//
//	kvCacheUtilizationMetric: string  metric spec of the pool's KV-cache
//	                                  utilization (default
//	                                  llm_d_epp_average_kv_cache_utilization)
//	queueSizeMetric: string           metric spec of its waiting queue
//	                                  (default llm_d_epp_average_queue_size)
//
// The values are kept in a poll.Values: the source's poll goroutines
// write them, the scorers read them.
type Extractor struct {
	scheduling.Named
	kv, queue scrape.Selector
	vals      poll.Values
}

// NewExtractor is multicluster-metrics-extractor's factory.
func NewExtractor(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p ExtractorParams
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	x := &Extractor{Named: scheduling.NewNamed(ExtractorType, name)}
	var err error
	if x.kv, err = scrape.ParseSelector(cmp.Or(p.KVCacheUtilizationMetric, DefaultKVCacheUtilizationMetric)); err != nil {
		return nil, fmt.Errorf("parameters.kvCacheUtilizationMetric: %w", err)
	}
	if x.queue, err = scrape.ParseSelector(cmp.Or(p.QueueSizeMetric, DefaultQueueSizeMetric)); err != nil {
		return nil, fmt.Errorf("parameters.queueSizeMetric: %w", err)
	}
	return x, nil
}

// AcceptsSource implements scheduling.DataExtractor: only a
// multicluster-metrics-data-source.
func (x *Extractor) AcceptsSource(src scheduling.DataSource) error {
	if _, ok := src.(*Source); !ok {
		return fmt.Errorf("%s reads a %s, not %s", ExtractorType, SourceType, src.TypedName().Type)
	}
	return nil
}

// Attributes implements the attribute plugins' check of the names a
// producer publishes.
func (x *Extractor) Attributes() []string { return []string{KVCacheUtilization, QueueSize} }

// Attribute is e's value of name; false when the endpoint has none.
func (x *Extractor) Attribute(name string, e *endpoints.Endpoint) (float64, bool) {
	return x.vals.Get(e.Address(), name)
}

// Read implements poll.Reader.
func (x *Extractor) Read(e *endpoints.Endpoint, page []byte) error {
	got := map[string]float64{}
	var missing []string
	for _, m := range []struct {
		attr string
		sel  scrape.Selector
	}{{KVCacheUtilization, x.kv}, {QueueSize, x.queue}} {
		v, ok, err := promtext.Max(page, m.sel.Name, func(s *dto.Metric) bool { return matches(s, m.sel.Labels) })
		if err != nil {
			return err
		}
		if !ok {
			// As llm-d: the previous value stays, and the miss is
			// reported (logged by the poller).
			if prev, had := x.vals.Get(e.Address(), m.attr); had {
				got[m.attr] = prev
			}
			missing = append(missing, m.sel.Name)
			continue
		}
		got[m.attr] = v
	}
	x.vals.Set(e.Address(), got)
	if len(missing) > 0 {
		return fmt.Errorf("no sample of %s on the page", strings.Join(missing, ", "))
	}
	return nil
}

func matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// Keep implements poll.Reader.
func (x *Extractor) Keep(present map[string]bool) { x.vals.Keep(present) }

var (
	_ scheduling.DataSource    = (*Source)(nil)
	_ scheduling.DataExtractor = (*Extractor)(nil)
	_ poll.Reader              = (*Extractor)(nil)
)

// Find is the one multicluster-metrics-extractor among all (the configured
// plugins), for the scorers that read it: an error when there is none or
// several.
func Find(all []scheduling.Plugin) (*Extractor, error) {
	var found *Extractor
	for _, p := range all {
		x, ok := p.(*Extractor)
		if !ok {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("two %s plugins (%q, %q): kvgate reads the cluster metrics of one", ExtractorType, found.TypedName().Name, x.TypedName().Name)
		}
		found = x
	}
	if found == nil {
		return nil, fmt.Errorf("needs a %s (under a %s in dataLayer.sources) for the clusters' metrics", ExtractorType, SourceType)
	}
	return found, nil
}
