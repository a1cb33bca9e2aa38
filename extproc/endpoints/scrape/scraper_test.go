package scrape

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/endpoints"
	kvtest "github.com/kvgate/kvgate/internal/testutil"
)

// Server behaviours a model server can switch between.
const (
	serveOK int32 = iota
	serve500
	serveGarbage
	serveHang
	serveNoMetrics
)

// modelServer is a real HTTP server over loopback serving a /metrics page
// whose queue length the test controls.
type modelServer struct {
	*httptest.Server
	mode    atomic.Int32
	waiting atomic.Int32
	hits    atomic.Int64
}

func newModelServer(t *testing.T) *modelServer {
	ms := &modelServer{}
	ms.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms.hits.Add(1)
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		switch ms.mode.Load() {
		case serve500:
			http.Error(w, "engine dead", http.StatusInternalServerError)
		case serveGarbage:
			fmt.Fprintln(w, `vllm:num_requests_waiting{model_name="x" 1`)
		case serveHang:
			<-r.Context().Done()
		case serveNoMetrics:
			fmt.Fprintln(w, "# HELP up Up.\nup 1")
		default:
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %d\n"+
				"vllm:num_requests_running{model_name=\"m\"} 2\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n", ms.waiting.Load())
		}
	}))
	t.Cleanup(ms.Close)
	return ms
}

func (ms *modelServer) addr() string { return strings.TrimPrefix(ms.URL, "http://") }

type harness struct {
	ds     *endpoints.Datastore
	s      *Scraper
	client *http.Client
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{ds: endpoints.NewDatastore(), done: make(chan error, 1)}
	// Fast enough for quick transitions, slow enough that a loaded
	// machine running -race does not time out healthy scrapes often.
	cfg.Interval = 25 * time.Millisecond
	cfg.Timeout = 20 * time.Millisecond
	if cfg.FailureThreshold == 0 {
		cfg.FailureThreshold = 2
	}
	h.client = NewClient(time.Second)
	cfg.Client = h.client
	cfg.Logger = slog.New(slog.DiscardHandler)
	h.s = New(h.ds, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.s.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	<-h.done
	h.cancel = nil
	h.client.CloseIdleConnections()
}

func (h *harness) candidates() []string {
	var out []string
	for _, e := range h.ds.Candidates() {
		out = append(out, e.Name())
	}
	return out
}

func TestScrapePublishesMetrics(t *testing.T) {
	a, b := newModelServer(t), newModelServer(t)
	a.waiting.Store(3)
	b.waiting.Store(9)
	h := start(t, Config{Pool: "pool"})
	if err := h.ds.Replace([]endpoints.Spec{
		{Name: "a", Address: a.addr()},
		// MetricsURL overrides the address for scraping.
		{Name: "b", Address: "127.0.0.1:1", MetricsURL: b.URL + "/metrics"},
	}); err != nil {
		t.Fatal(err)
	}
	ea, eb := h.ds.Get("a"), h.ds.Get("b")
	kvtest.WaitFor(t, "first scrapes", func() bool {
		return ea.Metrics().WaitingQueueSize == 3 && eb.Metrics().WaitingQueueSize == 9
	})
	m := ea.Metrics()
	if m.RunningRequests != 2 || m.KVCacheUsage != 0.5 || m.UpdateTime.IsZero() {
		t.Errorf("snapshot %+v", m)
	}
	if age := ea.MetricsAge(time.Now()); age < 0 || age == time.Duration(1<<63-1) {
		t.Errorf("MetricsAge = %v after a scrape", age)
	}
	// Later pages replace the snapshot.
	a.waiting.Store(4)
	kvtest.WaitFor(t, "updated queue", func() bool { return ea.Metrics().WaitingQueueSize == 4 })
}

func TestFreshEndpointIsStaleCandidate(t *testing.T) {
	ds := endpoints.NewDatastore()
	if err := ds.Replace([]endpoints.Spec{{Name: "a", Address: "127.0.0.1:9"}}); err != nil {
		t.Fatal(err)
	}
	// Before any scraper ran: usable, and visibly stale.
	if len(ds.Candidates()) != 1 {
		t.Fatal("a never-scraped endpoint is not a candidate")
	}
	if age := ds.Get("a").MetricsAge(time.Now()); age != time.Duration(1<<63-1) {
		t.Errorf("MetricsAge = %v, want infinitely stale", age)
	}
}

func TestHealthTransitions(t *testing.T) {
	tests := []struct {
		mode   int32
		reason string
	}{
		{serve500, "http_status"},
		{serveGarbage, "parse"},
		{serveHang, "timeout"},
		{serveNoMetrics, "no_metrics"},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			srv, other := newModelServer(t), newModelServer(t)
			h := start(t, Config{Pool: "p"})
			if err := h.ds.Replace([]endpoints.Spec{{Name: "a", Address: srv.addr()}, {Name: "b", Address: other.addr()}}); err != nil {
				t.Fatal(err)
			}
			ea := h.ds.Get("a")
			kvtest.WaitFor(t, "first scrape", func() bool { return !ea.Metrics().UpdateTime.IsZero() })

			srv.mode.Store(tt.mode)
			kvtest.WaitFor(t, "eviction", func() bool { return slices.Equal(h.candidates(), []string{"b"}) })
			if len(h.ds.All()) != 2 {
				t.Errorf("unhealthy endpoint left All()")
			}
			// Failures keep the last good snapshot, which only ages. It is
			// read after the eviction: a healthy scrape may still land
			// between the first one and the switch to failing.
			good := ea.Metrics()
			if good.UpdateTime.IsZero() {
				t.Fatal("eviction dropped the last good snapshot")
			}
			failed := errCount(h.s, tt.reason)
			kvtest.WaitFor(t, tt.reason+" errors counted", func() bool { return errCount(h.s, tt.reason) >= failed+2 })
			if ea.Metrics() != good {
				t.Errorf("a failed scrape replaced the snapshot")
			}

			srv.mode.Store(serveOK)
			kvtest.WaitFor(t, "recovery", func() bool { return slices.Equal(h.candidates(), []string{"a", "b"}) })
			if ea.Metrics() == good {
				t.Errorf("recovered endpoint has no new snapshot")
			}
		})
	}
}

func TestUnreachableEndpointLeaves(t *testing.T) {
	srv := newModelServer(t)
	addr := srv.addr()
	srv.Close() // nothing listens there any more
	h := start(t, Config{})
	if err := h.ds.Replace([]endpoints.Spec{{Name: "gone", Address: addr}}); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, "eviction", func() bool { return len(h.ds.Candidates()) == 0 })
	kvtest.WaitFor(t, "connect errors counted", func() bool { return errCount(h.s, "connect") >= 2 })
}

// errCount reads one reason's error counter.
func errCount(s *Scraper, name string) uint64 {
	for r := range numReasons {
		if r.String() == name {
			return s.stats.errors[r].Load()
		}
	}
	panic("unknown reason " + name)
}

func TestCollector(t *testing.T) {
	srv := newModelServer(t)
	srv.mode.Store(serve500)
	h := start(t, Config{Pool: "llama"})
	if err := h.ds.Replace([]endpoints.Spec{{Name: "a", Address: srv.addr()}}); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, "errors", func() bool { return errCount(h.s, "http_status") >= 1 })
	h.stop()
	// Under load a scrape may also time out, so the expectation reads the
	// counts back; what is checked is the exposition: names, help, labels.
	var want strings.Builder
	want.WriteString(`# HELP kvgate_endpoint_scrape_errors_total Failed metrics scrapes of the pool's model servers, by reason.
# TYPE kvgate_endpoint_scrape_errors_total counter
`)
	var total uint64
	for _, r := range []string{"connect", "http_status", "no_metrics", "parse", "request", "timeout", "too_large"} {
		n := errCount(h.s, r)
		total += n
		fmt.Fprintf(&want, "kvgate_endpoint_scrape_errors_total{name=\"llama\",reason=%q} %d\n", r, n)
	}
	if total != h.s.stats.scrapes.Load() || errCount(h.s, "http_status") == 0 {
		t.Errorf("%d errors of %d scrapes, all should have failed", total, h.s.stats.scrapes.Load())
	}
	fmt.Fprintf(&want, `# HELP kvgate_endpoint_scrape_late_timeouts_total Scrape timeouts noticed well after their deadline because the picker itself ran late; not counted against the server.
# TYPE kvgate_endpoint_scrape_late_timeouts_total counter
kvgate_endpoint_scrape_late_timeouts_total{name="llama"} 0
# HELP kvgate_endpoint_scrape_loops Running scrape loops; equals the pool's endpoint count unless loops leak or lag.
# TYPE kvgate_endpoint_scrape_loops gauge
kvgate_endpoint_scrape_loops{name="llama"} 0
# HELP kvgate_endpoint_scrapes_total Metrics scrapes of the pool's model servers, successful or not.
# TYPE kvgate_endpoint_scrapes_total counter
kvgate_endpoint_scrapes_total{name="llama"} %d
`, total)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h.s)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String())); err != nil {
		t.Error(err)
	}
}

func TestLoopsFollowMembershipWithoutLeaks(t *testing.T) {
	servers := []*modelServer{newModelServer(t), newModelServer(t), newModelServer(t)}
	before := runtime.NumGoroutine()

	h := start(t, Config{})
	specs := make([]endpoints.Spec, len(servers))
	for i, s := range servers {
		specs[i] = endpoints.Spec{Name: fmt.Sprintf("ep-%d", i), Address: s.addr()}
	}
	if err := h.ds.Replace(specs); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, "three loops", func() bool { return h.s.running.Load() == 3 })
	for _, e := range h.ds.All() {
		kvtest.WaitFor(t, "scrape of "+e.Name(), func() bool { return !e.Metrics().UpdateTime.IsZero() })
	}

	// Removing an endpoint stops its loop; its server sees no more scrapes.
	if err := h.ds.Replace(specs[1:]); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, "two loops", func() bool { return h.s.running.Load() == 2 })
	hits := servers[0].hits.Load()
	// A changed spec restarts the loop (new Endpoint value).
	specs[1].Labels = map[string]string{endpoints.RoleLabel: "decode"}
	if err := h.ds.Replace(specs[1:]); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, "new ep-1 scraped", func() bool { return !h.ds.Get("ep-1").Metrics().UpdateTime.IsZero() })
	kvtest.WaitFor(t, "two loops after restart", func() bool { return h.s.running.Load() == 2 })
	if got := servers[0].hits.Load(); got != hits {
		t.Errorf("removed endpoint scraped %d more times", got-hits)
	}

	h.stop()
	if n := h.s.running.Load(); n != 0 {
		t.Fatalf("%d loops survived Run", n)
	}
	if err := h.s.Run(context.Background()); !errors.Is(err, ErrAlreadyRan) {
		t.Errorf("second Run: %v", err)
	}
	for _, s := range servers {
		s.CloseClientConnections()
	}
	kvtest.WaitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}

func TestOversizedPage(t *testing.T) {
	srv := newModelServer(t)
	h := start(t, Config{MaxPageBytes: 64, FailureThreshold: 1})
	if err := h.ds.Replace([]endpoints.Spec{{Name: "a", Address: srv.addr()}}); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, "eviction", func() bool { return len(h.ds.Candidates()) == 0 })
	kvtest.WaitFor(t, "too_large counted", func() bool { return errCount(h.s, "too_large") >= 1 })
}

// BenchmarkScrapeOnce is one full scrape of a typical vLLM page over
// loopback keep-alive: request, transfer, parse, publish. The client and
// the test server share the CPU, so this bounds the picker's cost from above.
func BenchmarkScrapeOnce(b *testing.B) {
	page := readFixture(b, "vllm.txt")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) }))
	defer srv.Close()
	ds := endpoints.NewDatastore()
	if err := ds.Replace([]endpoints.Spec{{Name: "a", Address: strings.TrimPrefix(srv.URL, "http://")}}); err != nil {
		b.Fatal(err)
	}
	s := New(ds, Config{Timeout: time.Second, Interval: 2 * time.Second})
	e := ds.Get("a")
	url := s.metricsURL(e)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.scrapeOnce(context.Background(), e, url, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/scrape")
}

// TestJudge: eviction needs the threshold of consecutive failures over at
// least the window, once per run of failures.
func TestJudge(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		name     string
		failures []time.Time
		want     []bool
		definite bool
	}{
		{"definite failures need no window", []time.Time{ms(0), ms(1), ms(2)}, []bool{false, false, true}, true},
		{"burst inside the window", []time.Time{ms(0), ms(1), ms(2), ms(3), ms(4)}, []bool{false, false, false, false, false}, false},
		{"threshold over the window", []time.Time{ms(0), ms(200), ms(400), ms(600)}, []bool{false, false, false, true}, false},
		{"window then threshold", []time.Time{ms(0), ms(600), ms(601)}, []bool{false, false, true}, false},
		{"evicts once", []time.Time{ms(0), ms(300), ms(600), ms(900)}, []bool{false, false, true, false}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := judge{threshold: 3, window: 500 * time.Millisecond}
			for i, at := range tc.failures {
				if got := j.failed(at, tc.definite); got != tc.want[i] {
					t.Fatalf("failure %d: evict %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
	j := judge{threshold: 1, window: 0}
	if !j.failed(t0, false) {
		t.Fatal("threshold 1 did not evict")
	}
	j.succeeded()
	if !j.failed(t0, false) {
		t.Fatal("a new run of failures after a success did not evict")
	}
}

// TestSlowServerIsNotDead (Medium): a server that answers /metrics in 60 ms
// (a busy engine; or a picker starved of CPU, which looks the same) stays
// a candidate at the default settings, where a 40 ms timeout evicted it.
func TestSlowServerIsNotDead(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(60 * time.Millisecond)
		served.Add(1)
		fmt.Fprintln(w, "vllm:num_requests_waiting{model_name=\"m\"} 1\nvllm:num_requests_running{model_name=\"m\"} 1")
	}))
	defer srv.Close()
	ds := endpoints.NewDatastore()
	s := New(ds, Config{Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := ds.Replace([]endpoints.Spec{{Name: "slow", Address: strings.TrimPrefix(srv.URL, "http://")}}); err != nil {
		t.Fatal(err)
	}
	for served.Load() < 12 { // about ten intervals of slow answers
		if len(ds.Candidates()) != 1 {
			t.Fatalf("slow server evicted after %d answers", served.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ds.Get("slow").Metrics().UpdateTime.IsZero() {
		t.Fatal("slow answers never made a snapshot")
	}
}

// TestRoutableAfterFirstScrape (Low): with AwaitFirstScrape a new endpoint
// is a candidate only once a scrape succeeded; one whose /metrics never
// answers is never routed to.
func TestRoutableAfterFirstScrape(t *testing.T) {
	good := newModelServer(t)
	dead := newModelServer(t)
	dead.mode.Store(serve500)
	ds := endpoints.NewDatastoreWith(endpoints.Config{AwaitFirstScrape: true})
	if err := ds.Replace([]endpoints.Spec{{Name: "good", Address: good.addr()}, {Name: "dead", Address: dead.addr()}}); err != nil {
		t.Fatal(err)
	}
	if n := len(ds.Candidates()); n != 0 {
		t.Fatalf("%d candidates before any scrape", n)
	}
	s := New(ds, Config{Interval: 25 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	kvtest.WaitFor(t, "first scrape admits good", func() bool { return len(ds.Candidates()) == 1 })
	kvtest.WaitFor(t, "dead scraped a few times", func() bool { return dead.hits.Load() >= 3 })
	if c := ds.Candidates(); len(c) != 1 || c[0].Name() != "good" {
		t.Fatalf("candidates %v", c)
	}
}
