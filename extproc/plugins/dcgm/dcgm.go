package dcgm

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/poll"
	"github.com/kvgate/kvgate/extproc/plugins/metricsdatasource"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
	"github.com/kvgate/kvgate/internal/promtext"
)

// Registered plugin types.
const (
	SourceType    = "dcgm-data-source"
	ExtractorType = "dcgm-extractor"
)

// Defaults (llm-d's) and the exporter's names.
const (
	DefaultPort = 9400
	// UtilMetric is the GPU utilization the exporter reports, 0-100.
	UtilMetric = "DCGM_FI_DEV_GPU_UTIL"
	// GPUUtilization is the attribute the extractor produces.
	GPUUtilization = "GPUUtilization"
)

// Params are dcgm-data-source's parameters.
type Params struct {
	Scheme             string            `json:"scheme"`
	Path               string            `json:"path"`
	Port               *int              `json:"port"`
	InsecureSkipVerify *bool             `json:"insecureSkipVerify"`
	UseNodeAddress     bool              `json:"useNodeAddress"`
	Interval           duration.Duration `json:"interval"`
}

// Source implements dcgm-data-source.
//
// Parameters (llm-d's names and defaults):
//
//	scheme: string            "http" (default) or "https"
//	path: string              default "/metrics"
//	port: int                 the exporter's port (default 9400)
//	insecureSkipVerify: bool  default true
//	useNodeAddress: bool      fetch from the endpoint's node address
//	                          (an exporter DaemonSet) rather than its own
//	                          host (a sidecar; default false)
//	interval: duration        poll period, rounded to a multiple of
//	                          --refresh-metrics-interval (default: that
//	                          interval)
type Source struct {
	scheduling.Named
	metricsdatasource.Polling
	scheme, path string
	port         int
}

// NewSource is dcgm-data-source's factory.
func NewSource(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	port := DefaultPort
	if p.Port != nil {
		port = *p.Port
	}
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("parameters.port: want 1-65535, got %d", port)
	}
	// The scheme, path and TLS checks of llm-d's HTTP sources.
	shared, err := json.Marshal(metricsdatasource.Params{Scheme: p.Scheme, Path: p.Path, InsecureSkipVerify: p.InsecureSkipVerify, Interval: p.Interval})
	if err != nil {
		return nil, err
	}
	target, interval, err := metricsdatasource.HTTPTarget(shared, "/metrics")
	if err != nil {
		return nil, err
	}
	s := &Source{Named: scheduling.NewNamed(SourceType, name), scheme: target.Scheme, path: target.Path, port: port}
	s.Interval = interval
	var log *slog.Logger
	if h != nil {
		log = h.Log
	}
	url := func(e *endpoints.Endpoint) string { return s.URL(e.Address()) }
	if p.UseNodeAddress {
		url = func(e *endpoints.Endpoint) string {
			if e.Spec().NodeAddress == "" {
				return "" // no node known: no data
			}
			return s.URL(e.Spec().NodeAddress)
		}
	}
	s.Poller = poll.New(SourceType, url, target.TLS, log)
	return s, nil
}

// URL is the exporter's page beside the endpoint at address.
func (s *Source) URL(address string) string {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	return s.scheme + "://" + net.JoinHostPort(host, strconv.Itoa(s.port)) + s.path
}

// Extractor implements dcgm-extractor.
//
// Parameters: none.
//
// Ownership: util belongs to mu; the source's poll goroutines write it,
// the scheduling plugins read it.
type Extractor struct {
	scheduling.Named
	mu   sync.RWMutex
	util map[string]float64
}

// NewExtractor is dcgm-extractor's factory.
func NewExtractor(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(ExtractorType, name, raw)
	if err != nil {
		return nil, err
	}
	return &Extractor{Named: n, util: map[string]float64{}}, nil
}

// AcceptsSource implements scheduling.DataExtractor: only a dcgm-data-source.
func (x *Extractor) AcceptsSource(src scheduling.DataSource) error {
	if _, ok := src.(*Source); !ok {
		return fmt.Errorf("%s reads a %s, not %s", ExtractorType, SourceType, src.TypedName().Type)
	}
	return nil
}

// Attribute is e's value of name (only GPUUtilization); false when the
// endpoint has none.
func (x *Extractor) Attribute(name string, e *endpoints.Endpoint) (float64, bool) {
	if name != GPUUtilization {
		return 0, false
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	v, ok := x.util[e.Address()]
	return v, ok
}

// Attributes implements the attribute plugins' check of the names a
// producer publishes.
func (x *Extractor) Attributes() []string { return []string{GPUUtilization} }

// Read implements poll.Reader.
func (x *Extractor) Read(e *endpoints.Endpoint, doc []byte) error {
	pod := e.Name()
	if dp := e.Spec().DataParallel; dp != nil {
		pod = dp.Server // one rank of a data-parallel pod
	}
	v, ok, err := Utilization(doc, pod)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if ok {
		x.util[e.Address()] = v
	} else {
		delete(x.util, e.Address())
	}
	return nil
}

// Keep implements poll.Reader.
func (x *Extractor) Keep(present map[string]bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for a := range x.util {
		if !present[a] {
			delete(x.util, a)
		}
	}
}

// Utilization reads an exporter page: the highest DCGM_FI_DEV_GPU_UTIL of
// the samples of pod (pod label equal to it, or to the pod of a
// <pod>-rank-<i> endpoint) or without a pod label, scaled to [0, 1];
// false when there is none.
func Utilization(page []byte, pod string) (float64, bool, error) {
	v, ok, err := promtext.Max(page, UtilMetric, func(m *dto.Metric) bool { return samplePod(m, pod) })
	if err != nil || !ok {
		return 0, false, err
	}
	return min(max(v/100, 0), 1), true, nil
}

func samplePod(m *dto.Metric, pod string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == "pod" {
			return l.GetValue() == pod
		}
	}
	return true
}

var (
	_ scheduling.DataSource    = (*Source)(nil)
	_ scheduling.DataExtractor = (*Extractor)(nil)
	_ poll.Reader              = (*Extractor)(nil)
)
