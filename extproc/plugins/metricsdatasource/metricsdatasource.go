// Package metricsdatasource is llm-d's metrics-data-source: the data-layer
// source that polls each model server's Prometheus page. In kvgate it
// configures the picker's scraper (extproc/endpoints/scrape): where the page
// is and how it is fetched; a core-metrics-extractor says how it is read.
//
// Parameters (llm-d's names and defaults):
//
//	scheme: string           "http" (default) or "https"
//	path: string             URL path of the page (default "/metrics")
//	insecureSkipVerify: bool  do not verify an https server's certificate
//	                         (default true, as llm-d: pods serve
//	                         self-signed certificates)
//	caCertPath: string       PEM CA bundle that verifies the server when
//	                         insecureSkipVerify is false
//	clientCertPath: string   client certificate (PEM) for mTLS; set with
//	                         clientKeyPath
//	clientKeyPath: string    its private key (PEM)
//	interval: duration       scrape period, rounded to a multiple of
//	                         --refresh-metrics-interval (default: that
//	                         interval)
//
// An endpoint's own metricsURL (static endpoints file) still wins over the
// scheme and path.
package metricsdatasource

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/poll"
	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
)

// Type is the registered plugin type.
const Type = "metrics-data-source"

// Params are the plugin's parameters.
type Params struct {
	Scheme             string            `json:"scheme"`
	Path               string            `json:"path"`
	InsecureSkipVerify *bool             `json:"insecureSkipVerify"`
	CACertPath         string            `json:"caCertPath"`
	ClientCertPath     string            `json:"clientCertPath"`
	ClientKeyPath      string            `json:"clientKeyPath"`
	Interval           duration.Duration `json:"interval"`
}

// Source implements metrics-data-source.
type Source struct {
	scheduling.Named
	target   scrape.Target
	interval time.Duration
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	target, interval, err := HTTPTarget(raw, "/metrics")
	if err != nil {
		return nil, err
	}
	return &Source{Named: scheduling.NewNamed(Type, name), target: target, interval: interval}, nil
}

// HTTPTarget decodes the parameters llm-d's HTTP data sources share (those
// of Params) into where and how each endpoint is fetched, and the
// configured interval (0: every base tick). defaultPath applies when path
// is not given.
func HTTPTarget(raw json.RawMessage, defaultPath string) (scrape.Target, time.Duration, error) {
	var p Params
	var t scrape.Target
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return t, 0, err
	}
	interval := time.Duration(p.Interval)
	if interval < 0 {
		return t, 0, fmt.Errorf("parameters.interval must not be negative, got %s", interval)
	}
	switch strings.ToLower(p.Scheme) {
	case "", "http":
		t.Scheme = "http"
	case "https":
		t.Scheme = "https"
	default:
		return t, 0, fmt.Errorf("parameters.scheme: want http or https, got %q", p.Scheme)
	}
	t.Path = p.Path
	if t.Path == "" {
		t.Path = defaultPath
	}
	if !strings.HasPrefix(t.Path, "/") {
		return t, 0, fmt.Errorf("parameters.path must start with /, got %q", p.Path)
	}
	tlsCfg, err := tlsConfig(p)
	if err != nil {
		return t, 0, err
	}
	t.TLS = tlsCfg
	return t, interval, nil
}

// tlsConfig is the https client's configuration; nil when nothing differs
// from Go's defaults.
func tlsConfig(p Params) (*tls.Config, error) {
	skip := p.InsecureSkipVerify == nil || *p.InsecureSkipVerify
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: skip} //nolint:gosec // llm-d's documented default; configurable
	if p.CACertPath != "" {
		pem, err := os.ReadFile(p.CACertPath)
		if err != nil {
			return nil, fmt.Errorf("parameters.caCertPath: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("parameters.caCertPath: %s holds no PEM certificate", p.CACertPath)
		}
		c.RootCAs = pool
	}
	if (p.ClientCertPath == "") != (p.ClientKeyPath == "") {
		return nil, errors.New("parameters.clientCertPath and clientKeyPath must be set together")
	}
	if p.ClientCertPath != "" {
		cert, err := tls.LoadX509KeyPair(p.ClientCertPath, p.ClientKeyPath)
		if err != nil {
			return nil, fmt.Errorf("parameters.clientCertPath/clientKeyPath: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// DataLayerSource implements scheduling.DataSource.
func (s *Source) DataLayerSource() {}

// ScrapeTarget is where and how pages are fetched.
func (s *Source) ScrapeTarget() scrape.Target { return s.target }

// ScrapeInterval is the configured period rounded to the nearest multiple
// of base (at least base), or base when none was configured.
func (s *Source) ScrapeInterval(base time.Duration) time.Duration {
	return RoundInterval(s.interval, base)
}

// RoundInterval is interval rounded to the nearest multiple of base (at
// least base), or base when interval is 0, as llm-d rounds its data
// sources' intervals to --refresh-metrics-interval.
func RoundInterval(interval, base time.Duration) time.Duration {
	if interval == 0 || base <= 0 {
		return base
	}
	n := math.Round(float64(interval) / float64(base))
	return base * time.Duration(max(1, n))
}

var _ scheduling.DataSource = (*Source)(nil)

// Polling is what llm-d's polling HTTP sources (models-data-source,
// dcgm-data-source, multicluster-metrics-data-source) share: the poller,
// the configured interval and the extractors wired under the source.
// Embedded, it makes the source a scheduling.DataSource the loader wires
// and the picker polls.
type Polling struct {
	Poller   *poll.Poller
	Interval time.Duration
	// readers are the extractors wired under the source; set while the
	// configuration is built, read-only once polling runs.
	readers []poll.Reader
}

// DataLayerSource implements scheduling.DataSource.
func (p *Polling) DataLayerSource() {}

// Connect wires an extractor under the source
// (dataLayer.sources[].extractors); the loader connects only extractors
// that accepted the source.
func (p *Polling) Connect(x scheduling.DataExtractor) {
	if r, ok := x.(poll.Reader); ok {
		p.readers = append(p.readers, r)
	}
}

// Poll runs until ctx ends: every interval (rounded to a multiple of
// base) it fetches every endpoint's document and hands it to the wired
// extractors.
func (p *Polling) Poll(ctx context.Context, ds *endpoints.Datastore, base time.Duration) error {
	return p.Poller.Run(ctx, ds, RoundInterval(p.Interval, base), p.readers)
}

// Readers are the wired extractors.
func (p *Polling) Readers() []poll.Reader { return p.readers }
