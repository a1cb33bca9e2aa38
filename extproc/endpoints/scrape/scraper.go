package scrape

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// Defaults; see Config.
const (
	DefaultInterval         = 50 * time.Millisecond
	DefaultFailureThreshold = 5
	DefaultMaxPageBytes     = 4 << 20
	// DefaultMinTimeout is the least default scrape timeout: a busy
	// server's Python event loop (or the picker's own GC) can take tens of
	// milliseconds to answer, and that is not death.
	DefaultMinTimeout = 250 * time.Millisecond
	// DefaultFailureWindow is the least wall time consecutive failures
	// must span before they evict.
	DefaultFailureWindow = 500 * time.Millisecond
)

// Config tunes a Scraper. Zero fields take the defaults.
type Config struct {
	// Pool names the InferencePool in the scrape counters' "name" label.
	Pool string
	// Interval between scrapes of one endpoint (--refresh-metrics-interval,
	// default 50 ms as in GIE).
	Interval time.Duration
	// Timeout bounds one scrape; default 4/5 of Interval but at least
	// DefaultMinTimeout. Scrapes of one endpoint never overlap: a scrape
	// longer than Interval skips ticks.
	Timeout time.Duration
	// FailureThreshold is how many consecutive failed scrapes take an
	// endpoint out of the candidate set. The default, 5 (250 ms at 50 ms),
	// lies just past the 200 ms after which the saturation detector already
	// treats stale metrics as a full server: an endpoint is only removed once
	// it has stopped attracting traffic anyway, and one slow /metrics answer
	// (a GC pause, a busy Python event loop) never evicts it.
	FailureThreshold int
	// FailureWindow is the least wall time from the first to the last of
	// those failures (default DefaultFailureWindow): a burst of failures
	// in a moment of the picker's own overload is not a dead server. A
	// timeout noticed well after its deadline (the picker itself ran
	// late: CPU starvation) does not count as a failure at all.
	FailureWindow time.Duration
	// MaxPageBytes bounds a /metrics response; a larger page is an error.
	MaxPageBytes int64
	// Target is how a page is fetched when an endpoint names no metrics
	// URL of its own (llm-d's metrics-data-source): the zero Target is
	// http://<address>/metrics.
	Target Target
	// Engines chooses how each endpoint's page is read (llm-d's
	// core-metrics-extractor); nil reads vLLM and SGLang.
	Engines *Engines
	// Client is shared by every scrape loop; default NewClient(Timeout),
	// with Target.TLS for https.
	Client *http.Client
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = max(c.Interval*4/5, DefaultMinTimeout)
	}
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = DefaultFailureThreshold
	}
	if c.FailureWindow <= 0 {
		c.FailureWindow = DefaultFailureWindow
	}
	if c.MaxPageBytes <= 0 {
		c.MaxPageBytes = DefaultMaxPageBytes
	}
	if c.Client == nil {
		c.Client = NewClient(c.Timeout)
		if c.Target.TLS != nil {
			c.Client.Transport.(*http.Transport).TLSClientConfig = c.Target.TLS
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// NewClient returns the keep-alive client scrape loops share: one idle
// connection per endpoint is kept, so a steady scrape reuses its TCP
// connection instead of dialling 20 times a second.
func NewClient(dialTimeout time.Duration) *http.Client {
	return &http.Client{Transport: &http.Transport{
		// Pod IPs are dialled directly; an environment proxy would be wrong.
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// Scraper runs one scrape loop per endpoint of a datastore, started and
// stopped as membership changes.
//
// Ownership: the loops map and stopped flag belong to mu; each loop owns its
// endpoint's consecutive-failure count and is the only writer of that
// endpoint's metrics and health.
type Scraper struct {
	ds   *endpoints.Datastore
	cfg  Config
	bufs sync.Pool // *bytes.Buffer, at most MaxPageBytes each

	mu      sync.Mutex
	runCtx  context.Context // set by Run
	loops   map[*endpoints.Endpoint]context.CancelFunc
	stopped bool
	wg      sync.WaitGroup

	running atomic.Int64 // live loop goroutines
	stats   stats
}

// New returns a scraper for ds; Run starts it.
func New(ds *endpoints.Datastore, cfg Config) *Scraper {
	return &Scraper{
		ds:    ds,
		cfg:   cfg.withDefaults(),
		loops: map[*endpoints.Endpoint]context.CancelFunc{},
		bufs:  sync.Pool{New: func() any { return new(bytes.Buffer) }},
	}
}

// ErrAlreadyRan is returned by a second call to Run.
var ErrAlreadyRan = errors.New("scrape: Run called twice")

// Run scrapes until ctx is done, then stops every loop and returns once
// they have all exited.
func (s *Scraper) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.runCtx != nil {
		s.mu.Unlock()
		return ErrAlreadyRan
	}
	s.runCtx = ctx
	s.mu.Unlock()

	unsubscribe := s.ds.Subscribe(endpoints.ListenerFunc(s.endpointsChanged))
	<-ctx.Done()
	unsubscribe()

	s.mu.Lock()
	s.stopped = true
	for _, cancel := range s.loops {
		cancel()
	}
	clear(s.loops)
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Scraper) endpointsChanged(c endpoints.Change) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	for _, e := range c.Removed {
		if cancel, ok := s.loops[e]; ok {
			cancel()
			delete(s.loops, e)
		}
	}
	for _, e := range c.Added {
		if e.Spec().Hostname {
			// A peer cluster (multicluster-file-discovery) has no model
			// server page; multicluster-metrics-data-source polls it.
			continue
		}
		ctx, cancel := context.WithCancel(s.runCtx)
		s.loops[e] = cancel
		s.running.Add(1)
		s.wg.Go(func() {
			defer s.running.Add(-1)
			s.loop(ctx, e)
		})
	}
}

// Target is where an endpoint's metrics page is: scheme://<address><path>.
type Target struct {
	// Scheme is "http" (default) or "https".
	Scheme string
	// Path defaults to /metrics.
	Path string
	// TLS verifies (or, with InsecureSkipVerify, does not) an https
	// server and may carry a client certificate; nil is Go's defaults.
	TLS *tls.Config
}

func (t Target) url(address string) string {
	scheme, path := t.Scheme, t.Path
	if scheme == "" {
		scheme = "http"
	}
	if path == "" {
		path = "/metrics"
	}
	return scheme + "://" + address + path
}

func (s *Scraper) metricsURL(e *endpoints.Endpoint) string {
	if u := e.Spec().MetricsURL; u != "" {
		return u
	}
	return s.cfg.Target.url(e.Address())
}

func (s *Scraper) loop(ctx context.Context, e *endpoints.Endpoint) {
	url := s.metricsURL(e)
	schema := s.cfg.Engines.For(e)
	log := s.cfg.Logger.With("endpoint", e.Name(), "url", url)
	j := judge{threshold: s.cfg.FailureThreshold, window: s.cfg.FailureWindow}
	scrape := func() {
		began := time.Now()
		err := s.scrapeOnce(ctx, e, url, schema)
		if ctx.Err() != nil {
			return // stopping; the failure is ours, not the server's
		}
		s.stats.scrapes.Add(1)
		var se *scrapeError
		if errors.As(err, &se) {
			s.stats.errors[se.reason].Add(1)
		}
		now := time.Now()
		if err != nil {
			if se != nil && se.reason == reasonTimeout && now.Sub(began) > s.cfg.Timeout*3/2 {
				// Noticed late: the picker, not the server, was slow.
				s.stats.lateTimeouts.Add(1)
				log.Debug("scrape timed out while the picker ran late; not counted", "elapsed", now.Sub(began))
				return
			}
			if j.failed(now, se == nil || se.reason != reasonTimeout) {
				log.Warn("endpoint leaves the candidate set after failed scrapes", "failures", j.failures,
					"over", now.Sub(j.since), "err", err)
				s.ds.SetHealthy(e, false)
			} else {
				log.Debug("scrape failed", "failures", j.failures, "err", err)
			}
			return
		}
		if !s.ds.Healthy(e) {
			// Back after failures, or scraped for the first time.
			if j.failures > 0 {
				log.Info("endpoint is back in the candidate set", "after_failures", j.failures)
			}
			s.ds.SetHealthy(e, true)
		}
		j.succeeded()
	}

	// Scrape at once so a new endpoint has metrics quickly, then spread the
	// loops over the interval so a big pool is not scraped in bursts.
	scrape()
	select {
	case <-ctx.Done():
		return
	case <-time.After(rand.N(s.cfg.Interval)):
	}
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		scrape()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// judge decides when consecutive failures evict: threshold of them, once,
// and over at least window of wall time unless the latest is definite (a
// refused connection, an error status: nothing the picker's own slowness
// causes), so that a killed server leaves as fast as before.
type judge struct {
	threshold int
	window    time.Duration
	failures  int
	since     time.Time // the first failure of the run
	evicted   bool
}

// failed records a failure at now and reports whether it evicts.
func (j *judge) failed(now time.Time, definite bool) bool {
	if j.failures == 0 {
		j.since = now
	}
	j.failures++
	if j.evicted || j.failures < j.threshold || (!definite && now.Sub(j.since) < j.window) {
		return false
	}
	j.evicted = true
	return true
}

func (j *judge) succeeded() { j.failures, j.evicted = 0, false }

// scrapeOnce fetches and parses one page and publishes the snapshot.
func (s *Scraper) scrapeOnce(ctx context.Context, e *endpoints.Endpoint, url string, schema *Schema) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fail(reasonRequest, err)
	}
	// The classic text format: what Parse reads, and what every
	// prometheus_client serves without negotiation.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fail(reasonTimeout, err)
		}
		return fail(reasonConnect, err)
	}
	defer func() {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return fail(reasonStatus, fmt.Errorf("HTTP %s", resp.Status))
	}

	buf := s.bufs.Get().(*bytes.Buffer)
	defer s.bufs.Put(buf)
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, s.cfg.MaxPageBytes+1))
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fail(reasonTimeout, err)
	case err != nil:
		return fail(reasonConnect, err)
	case n > s.cfg.MaxPageBytes:
		return fail(reasonTooLarge, fmt.Errorf("page larger than %d bytes", s.cfg.MaxPageBytes))
	}
	m, err := ParseWith(buf.Bytes(), schema)
	switch {
	case errors.Is(err, ErrNoMetrics):
		return fail(reasonNoMetrics, err)
	case err != nil:
		return fail(reasonParse, err)
	}
	m.UpdateTime = time.Now()
	e.SetMetrics(&m)
	return nil
}

// scrapeError tags a failure with its counter reason.
type scrapeError struct {
	reason reason
	err    error
}

func (e *scrapeError) Error() string { return e.reason.String() + ": " + e.err.Error() }
func (e *scrapeError) Unwrap() error { return e.err }

func fail(r reason, err error) error { return &scrapeError{r, err} }
