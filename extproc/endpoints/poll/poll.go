// Package poll runs the data-layer HTTP sources that fetch a document from
// every endpoint of the pool on a period (llm-d's models-data-source and
// dcgm-data-source): one round fetches all endpoints at once, each fetch
// bounded by the period, and hands each document to the source's readers.
// A failed fetch, or a document a reader cannot read, is logged and leaves
// that reader's previous data, but only for MaxFailedRounds-1 rounds in a
// row: then the data is dropped, and the endpoint counts as having none
// until a document is read again. A dead exporter's last figures must not
// steer routing for good, any more than a model server's metrics do once
// its scrapes fail.
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

// MaxFailedRounds is the number of consecutive rounds without a document
// a reader could read after which that reader drops an endpoint's data:
// one failed fetch (a slow exporter, a restart) keeps the previous
// values, a few in a row mean they no longer describe the server.
const MaxFailedRounds = 3

// Reader receives a source's documents.
type Reader interface {
	// Read takes e's document; an error is logged.
	Read(e *endpoints.Endpoint, doc []byte) error
	// Keep is called after each round with the addresses whose data the
	// reader keeps: those in the pool that have a document to fetch and
	// whose last MaxFailedRounds rounds did not all fail. Data of other
	// endpoints is dropped.
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

	// mu serialises rounds. failed[j] counts, by address, the rounds in a
	// row that brought readers[j] no document it could read; it holds
	// only endpoints of the last round's pool.
	mu     sync.Mutex
	failed []map[string]int
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

// Round fetches every endpoint of eps once, each fetch bounded by timeout,
// and tells each reader which endpoints' data it keeps (Reader.Keep).
// Successive rounds must pass the same readers, in the same order.
func (p *Poller) Round(ctx context.Context, eps []*endpoints.Endpoint, timeout time.Duration, readers []Reader) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// read[i][j]: readers[j] took eps[i]'s document this round; nil for an
	// endpoint with nothing to fetch.
	read := make([][]bool, len(eps))
	var wg sync.WaitGroup
	for i, e := range eps {
		url := p.URL(e)
		if url == "" {
			continue
		}
		read[i] = make([]bool, len(readers))
		wg.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			doc, err := p.Fetch(fctx, url)
			if err != nil {
				if ctx.Err() == nil { // not shutting down
					p.log.Debug(p.Name+": fetch failed", "endpoint", e.Name(), "err", err)
				}
				return
			}
			for j, r := range readers {
				if err := r.Read(e, doc); err != nil {
					p.log.Debug(p.Name+": unreadable document", "endpoint", e.Name(), "err", err)
					continue
				}
				read[i][j] = true
			}
		})
	}
	wg.Wait()
	if len(p.failed) != len(readers) {
		p.failed = make([]map[string]int, len(readers))
	}
	for j, r := range readers {
		failed := make(map[string]int, len(p.failed[j]))
		present := make(map[string]bool, len(eps))
		for i, e := range eps {
			if read[i] == nil {
				continue // no document to fetch: nothing to keep
			}
			a := e.Address()
			if !read[i][j] {
				failed[a] = p.failed[j][a] + 1
			}
			if failed[a] < MaxFailedRounds {
				present[a] = true
			} else if failed[a] == MaxFailedRounds {
				p.log.Debug(p.Name+": no document for several rounds; the endpoint's data is dropped", "endpoint", e.Name(), "rounds", failed[a])
			}
		}
		p.failed[j] = failed
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
