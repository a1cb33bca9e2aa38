package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
	"github.com/kvgate/kvgate/extproc/plugins/metricsdatasource"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	SourceType    = "models-data-source"
	ExtractorType = "models-data-extractor"
)

// DefaultPath is the OpenAI model list.
const DefaultPath = "/v1/models"

// maxListBytes bounds one model list.
const maxListBytes = 1 << 20

// Model is one entry of a server's model list.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object,omitempty"`
	Created int64  `json:"created,omitempty"`
	OwnedBy string `json:"owned_by,omitempty"`
	Parent  string `json:"parent,omitempty"`
}

// list is the /v1/models response.
type list struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// Source implements models-data-source.
//
// Parameters (llm-d's names and defaults, those of metrics-data-source):
//
//	scheme: string            "http" (default) or "https"
//	path: string              default "/v1/models"
//	insecureSkipVerify: bool  default true
//	caCertPath: string        PEM CA bundle verifying the servers
//	clientCertPath: string    client certificate (PEM) for mTLS
//	clientKeyPath: string     its private key
//	interval: duration        poll period, rounded to a multiple of
//	                          --refresh-metrics-interval (default: that
//	                          interval)
type Source struct {
	scheduling.Named
	target   scrape.Target
	interval time.Duration
	client   *http.Client
	log      *slog.Logger
	// sinks are the extractors wired under the source; set while the
	// configuration is built, read-only once polling runs.
	sinks []*Extractor
}

// NewSource is models-data-source's factory.
func NewSource(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	target, interval, err := metricsdatasource.HTTPTarget(raw, DefaultPath)
	if err != nil {
		return nil, err
	}
	s := &Source{Named: scheduling.NewNamed(SourceType, name), target: target, interval: interval, log: slog.Default()}
	if h != nil && h.Log != nil {
		s.log = h.Log
	}
	s.client = &http.Client{Transport: &http.Transport{
		Proxy:               nil, // pod addresses are dialled directly
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     target.TLS,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     90 * time.Second,
	}}
	return s, nil
}

// DataLayerSource implements scheduling.DataSource.
func (s *Source) DataLayerSource() {}

// Connect wires an extractor under the source (dataLayer.sources[].extractors).
func (s *Source) Connect(x scheduling.DataExtractor) {
	if e, ok := x.(*Extractor); ok {
		s.sinks = append(s.sinks, e)
	}
}

// URL is where address's model list is fetched.
func (s *Source) URL(address string) string {
	return s.target.Scheme + "://" + address + s.target.Path
}

// Poll runs until ctx ends: every interval (rounded to a multiple of base)
// it fetches the model list of every endpoint of ds, all at once, and
// hands each to the wired extractors.
func (s *Source) Poll(ctx context.Context, ds *endpoints.Datastore, base time.Duration) error {
	every := metricsdatasource.RoundInterval(s.interval, base)
	if every <= 0 {
		return fmt.Errorf("%s: no poll interval", s.TypedName())
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.pollOnce(ctx, ds.All(), every)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// pollOnce fetches every endpoint's list, each bounded by the period.
func (s *Source) pollOnce(ctx context.Context, eps []*endpoints.Endpoint, timeout time.Duration) {
	var wg sync.WaitGroup
	present := make(map[string]bool, len(eps))
	for _, e := range eps {
		present[e.Address()] = true
		wg.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			models, err := s.Fetch(fctx, e.Address())
			if err != nil {
				if ctx.Err() == nil { // not shutting down
					s.log.Debug("models-data-source: poll failed; the previous list is kept", "endpoint", e.Name(), "err", err)
				}
				return
			}
			for _, x := range s.sinks {
				x.put(e.Address(), models)
			}
		})
	}
	wg.Wait()
	for _, x := range s.sinks {
		x.keep(present)
	}
}

// Fetch returns address's model list.
func (s *Source) Fetch(ctx context.Context, address string) ([]Model, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL(address), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %s", req.URL, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxListBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", req.URL, err)
	}
	if len(data) > maxListBytes {
		return nil, fmt.Errorf("GET %s: model list larger than %d bytes", req.URL, maxListBytes)
	}
	return ParseList(data)
}

// ParseList reads an OpenAI model list.
func ParseList(data []byte) ([]Model, error) {
	var l list
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("model list: %w", err)
	}
	if l.Data == nil {
		return nil, errors.New(`model list: no "data" array`)
	}
	for i, m := range l.Data {
		if m.ID == "" {
			return nil, fmt.Errorf("model list: data[%d] has no id", i)
		}
	}
	return l.Data, nil
}

// Extractor implements models-data-extractor.
//
// Parameters: none.
//
// Ownership: lists belongs to mu; the source's poll goroutines write it,
// plugins read it.
type Extractor struct {
	scheduling.Named
	mu    sync.RWMutex
	lists map[string]served
}

type served struct {
	models []Model
	at     time.Time
}

// NewExtractor is models-data-extractor's factory.
func NewExtractor(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(ExtractorType, name, raw)
	if err != nil {
		return nil, err
	}
	return &Extractor{Named: n, lists: map[string]served{}}, nil
}

// AcceptsSource implements scheduling.DataExtractor: only a
// models-data-source.
func (x *Extractor) AcceptsSource(src scheduling.DataSource) error {
	if _, ok := src.(*Source); !ok {
		return fmt.Errorf("%s reads a %s, not %s", ExtractorType, SourceType, src.TypedName().Type)
	}
	return nil
}

// Models is the endpoint's latest model list and when it was fetched;
// false before a poll succeeded. The slice is shared: do not modify it.
func (x *Extractor) Models(address string) ([]Model, time.Time, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	l, ok := x.lists[address]
	return l.models, l.at, ok
}

func (x *Extractor) put(address string, models []Model) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.lists[address] = served{models: models, at: time.Now()}
}

// keep drops the lists of endpoints no longer in the pool.
func (x *Extractor) keep(present map[string]bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for a := range x.lists {
		if !present[a] {
			delete(x.lists, a)
		}
	}
}

var (
	_ scheduling.DataSource    = (*Source)(nil)
	_ scheduling.DataExtractor = (*Extractor)(nil)
)
