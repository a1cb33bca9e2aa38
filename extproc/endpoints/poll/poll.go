// Package poll runs the data-layer HTTP sources that fetch a document from
// every endpoint of the pool on a period (llm-d's models-data-source and
// dcgm-data-source): one round fetches all endpoints at once, each fetch
// bounded by the period, and hands each document to the source's reader;
// a failed fetch is logged and leaves the reader's previous data.
package poll

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// MaxBytes bounds one fetched document.
const MaxBytes = 4 << 20

// Reader receives a source's documents.
type Reader interface {
	// Read takes e's document; an error is logged.
	Read(e *endpoints.Endpoint, doc []byte) error
	// Keep is called after each round with the addresses in the pool:
	// data of other endpoints is dropped.
	Keep(present map[string]bool)
}

// Poller fetches one document per endpoint.
type Poller struct {
	// Name says whose fetches the log lines are.
	Name string
	// URL is where e's document is; "" when e has none (it is skipped).
	URL func(e *endpoints.Endpoint) string
	// Limit bounds one fetched document; 0 means MaxBytes.
	Limit  int
	client *http.Client
	log    *slog.Logger
}

// New returns a poller whose https fetches use tlsCfg (nil: Go's defaults).
func New(name string, url func(*endpoints.Endpoint) string, tlsCfg *tls.Config, log *slog.Logger) *Poller {
	if log == nil {
		log = slog.Default()
	}
	return &Poller{Name: name, URL: url, log: log, client: &http.Client{Transport: &http.Transport{
		Proxy:               nil, // pod and node addresses are dialled directly
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsCfg,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     90 * time.Second,
	}}}
}

// Run polls ds's endpoints every period until ctx ends, handing the
// documents to readers.
func (p *Poller) Run(ctx context.Context, ds *endpoints.Datastore, every time.Duration, readers []Reader) error {
	if every <= 0 {
		return fmt.Errorf("%s: no poll interval", p.Name)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	defer p.client.CloseIdleConnections()
	for {
		p.Round(ctx, ds.All(), every, readers)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Round fetches every endpoint of eps once, each fetch bounded by timeout.
func (p *Poller) Round(ctx context.Context, eps []*endpoints.Endpoint, timeout time.Duration, readers []Reader) {
	var wg sync.WaitGroup
	present := make(map[string]bool, len(eps))
	for _, e := range eps {
		present[e.Address()] = true
		url := p.URL(e)
		if url == "" {
			continue
		}
		wg.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			doc, err := p.Fetch(fctx, url)
			if err != nil {
				if ctx.Err() == nil { // not shutting down
					p.log.Debug(p.Name+": fetch failed; the previous data is kept", "endpoint", e.Name(), "err", err)
				}
				return
			}
			for _, r := range readers {
				if err := r.Read(e, doc); err != nil {
					p.log.Debug(p.Name+": unreadable document; the previous data is kept", "endpoint", e.Name(), "err", err)
				}
			}
		})
	}
	wg.Wait()
	for _, r := range readers {
		r.Keep(present)
	}
}

// Fetch GETs url's document (200 only, at most Limit bytes).
func (p *Poller) Fetch(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %s", url, resp.Status)
	}
	limit := p.Limit
	if limit <= 0 {
		limit = MaxBytes
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if len(data) > limit {
		return nil, fmt.Errorf("GET %s: larger than %d bytes", url, limit)
	}
	return data, nil
}

// CloseIdleConnections closes the poller's idle keep-alive connections.
func (p *Poller) CloseIdleConnections() { p.client.CloseIdleConnections() }

// Values are the numbers a Reader keeps per endpoint address, by name.
// Set replaces an endpoint's set; Keep implements Reader.Keep. The zero
// Values is ready; it is safe for concurrent use (the poll goroutines
// write, the scheduling plugins read).
type Values struct {
	mu sync.RWMutex
	m  map[string]map[string]float64
}

// Get is address's value of name; false when it has none.
func (v *Values) Get(address, name string) (float64, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	x, ok := v.m[address][name]
	return x, ok
}

// Set makes vals address's values (nil or empty: none).
func (v *Values) Set(address string, vals map[string]float64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[string]map[string]float64{}
	}
	if len(vals) == 0 {
		delete(v.m, address)
		return
	}
	v.m[address] = vals
}

// Keep drops the values of addresses not in present.
func (v *Values) Keep(present map[string]bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for a := range v.m {
		if !present[a] {
			delete(v.m, a)
		}
	}
}
