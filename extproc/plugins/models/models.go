package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/poll"
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
	metricsdatasource.Polling
	target scrape.Target
}

// NewSource is models-data-source's factory.
func NewSource(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	target, interval, err := metricsdatasource.HTTPTarget(raw, DefaultPath)
	if err != nil {
		return nil, err
	}
	s := &Source{Named: scheduling.NewNamed(SourceType, name), target: target}
	s.Interval = interval
	var log *slog.Logger
	if h != nil {
		log = h.Log
	}
	s.Poller = poll.New(SourceType, func(e *endpoints.Endpoint) string { return s.URL(e.Address()) }, target.TLS, log)
	return s, nil
}

// URL is where address's model list is fetched.
func (s *Source) URL(address string) string {
	return s.target.Scheme + "://" + address + s.target.Path
}

// Fetch returns address's model list.
func (s *Source) Fetch(ctx context.Context, address string) ([]Model, error) {
	doc, err := s.Poller.Fetch(ctx, s.URL(address))
	if err != nil {
		return nil, err
	}
	return ParseList(doc)
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

// Read implements poll.Reader.
func (x *Extractor) Read(e *endpoints.Endpoint, doc []byte) error {
	models, err := ParseList(doc)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.lists[e.Address()] = served{models: models, at: time.Now()}
	return nil
}

// Keep implements poll.Reader: the lists of endpoints no longer in the
// pool are dropped.
func (x *Extractor) Keep(present map[string]bool) {
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
	_ poll.Reader              = (*Extractor)(nil)
)
