package scrape

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	kvtest "github.com/kvgate/kvgate/internal/testutil"
)

func TestParseSelector(t *testing.T) {
	tests := []struct {
		spec, want string
		err        bool
	}{
		{"", "", false},
		{"vllm:num_requests_waiting", "vllm:num_requests_waiting", false},
		{"nv_trt_llm_request_metrics{request_type=waiting}", `nv_trt_llm_request_metrics{request_type="waiting"}`, false},
		{`custom{a="x", b=y}`, `custom{a="x",b="y"}`, false},
		{"{a=b}", "", true},
		{"m{a=b", "", true},
		{"m{a}", "", true},
		{"bad name", "", true},
	}
	for _, tc := range tests {
		s, err := ParseSelector(tc.spec)
		if (err != nil) != tc.err {
			t.Fatalf("%q: err = %v", tc.spec, err)
		}
		if err == nil && s.String() != tc.want {
			t.Fatalf("%q = %s, want %s", tc.spec, s, tc.want)
		}
	}
}

func mustSchema(t *testing.T, queue, running, kv string) *Schema {
	t.Helper()
	var s Schema
	var err error
	for _, f := range []struct {
		dst  *Selector
		spec string
	}{{&s.Queue, queue}, {&s.Running, running}, {&s.KVUsage, kv}} {
		if *f.dst, err = ParseSelector(f.spec); err != nil {
			t.Fatal(err)
		}
	}
	return &s
}

// Engines named in llm-d's built-in table, and custom names, read pages
// Parse does not know; label selectors pick one series among several.
func TestParseWith(t *testing.T) {
	triton := BuiltinSchemas()["triton-tensorrt-llm"]
	trtllm := BuiltinSchemas()["trtllm-serve"]
	custom := mustSchema(t, "custom_queue_size{status=waiting}", "custom_running_size", "custom_cache_utilization")
	tests := []struct {
		name   string
		schema *Schema
		page   string
		want   endpoints.Metrics
		err    error
	}{
		{"triton label selectors", triton, `# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="m",request_type="waiting",version="1"} 7
nv_trt_llm_request_metrics{model="m",request_type="scheduled",version="1"} 3
nv_trt_llm_request_metrics{model="m",request_type="context",version="1"} 99
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="m"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="m"} 32
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m"} 4096
`, endpoints.Metrics{WaitingQueueSize: 7, RunningRequests: 3, KVCacheUsage: 0.25, BlockSize: 32, NumGPUBlocks: 4096}, nil},
		{"trtllm-serve", trtllm, "trtllm_num_requests_waiting 2\ntrtllm_num_requests_running 5\ntrtllm_kv_cache_utilization 0.5\ntrtllm_kv_cache_tokens_per_block 64\n",
			endpoints.Metrics{WaitingQueueSize: 2, RunningRequests: 5, KVCacheUsage: 0.5, BlockSize: 64}, nil},
		{"custom engine", custom, "custom_queue_size{status=\"waiting\"} 4\ncustom_queue_size{status=\"done\"} 40\ncustom_running_size 1\ncustom_cache_utilization 0.9\nvllm:num_requests_waiting 100\n",
			endpoints.Metrics{WaitingQueueSize: 4, RunningRequests: 1, KVCacheUsage: 0.9}, nil},
		{"vLLM page under a custom schema has none", custom, "vllm:num_requests_waiting 3\n", endpoints.Metrics{}, ErrNoMetrics},
		{"malformed wanted sample", custom, "custom_running_size{x=\"1\" 2\n", endpoints.Metrics{}, &ParseError{}},
		{"negative", custom, "custom_running_size -1\n", endpoints.Metrics{}, &ParseError{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseWith([]byte(tc.page), tc.schema)
			var pe *ParseError
			switch {
			case tc.err == nil && err != nil:
				t.Fatal(err)
			case errors.As(tc.err, &pe):
				if !errors.As(err, &pe) {
					t.Fatalf("err = %v, want a ParseError", err)
				}
				return
			case tc.err != nil:
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if m.WaitingQueueSize != tc.want.WaitingQueueSize || m.RunningRequests != tc.want.RunningRequests || m.KVCacheUsage != tc.want.KVCacheUsage ||
				m.BlockSize != tc.want.BlockSize || m.NumGPUBlocks != tc.want.NumGPUBlocks {
				t.Fatalf("metrics = %+v, want %+v", m, tc.want)
			}
		})
	}
}

// A nil schema is Parse, byte for byte.
func TestParseWithNilIsParse(t *testing.T) {
	page := readFixture(t, "vllm.txt")
	a, err1 := Parse(page)
	b, err2 := ParseWith(page, nil)
	if err1 != nil || err2 != nil || a.WaitingQueueSize != b.WaitingQueueSize || a.KVCacheUsage != b.KVCacheUsage || a.BlockSize != b.BlockSize {
		t.Fatalf("%+v %v / %+v %v", a, err1, b, err2)
	}
}

func TestEnginesFor(t *testing.T) {
	custom := mustSchema(t, "q", "r", "k")
	g := &Engines{Default: "vllm", Schemas: map[string]*Schema{"vllm": nil, "custom": custom}}
	ep := func(labels map[string]string) *endpoints.Endpoint {
		ds := endpoints.NewDatastore()
		if err := ds.Replace([]endpoints.Spec{{Name: "a", Address: "10.0.0.1:8000", Labels: labels}}); err != nil {
			t.Fatal(err)
		}
		return ds.Get("a")
	}
	for _, tc := range []struct {
		labels map[string]string
		want   *Schema
	}{
		{nil, nil},
		{map[string]string{EngineLabel: "custom"}, custom},
		{map[string]string{EngineLabelLegacy: "custom"}, custom},
		{map[string]string{EngineLabel: "unknown"}, nil},
	} {
		if got := g.For(ep(tc.labels)); got != tc.want {
			t.Fatalf("%v: schema %p, want %p", tc.labels, got, tc.want)
		}
	}
	var none *Engines
	if none.For(ep(nil)) != nil {
		t.Fatal("nil Engines chose a schema")
	}
}

// The scraper honours the target's scheme, path and TLS settings (a real
// TLS server over loopback whose certificate is trusted through the
// target's RootCAs), and reads the page with the endpoint's engine schema.
func TestScrapeTargetTLSAndSchema(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/custom/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "custom_queue_size{status=\"waiting\"} 6\ncustom_running_size 2\ncustom_cache_utilization 0.3")
	}))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	ds := endpoints.NewDatastore()
	s := New(ds, Config{
		// The timeout covers a TLS handshake, which the race detector and a
		// loaded machine can make take far longer than a plain scrape.
		Interval: 25 * time.Millisecond, Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
		Target:  Target{Scheme: "https", Path: "/custom/metrics", TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		Engines: &Engines{Default: "vllm", Schemas: map[string]*Schema{"vllm": nil, "mine": mustSchema(t, "custom_queue_size{status=waiting}", "custom_running_size", "custom_cache_utilization")}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := ds.Replace([]endpoints.Spec{{Name: "a", Address: strings.TrimPrefix(srv.URL, "https://"), Labels: map[string]string{EngineLabel: "mine"}}}); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, "metrics over https", func() bool {
		m := ds.Get("a").Metrics()
		return m.WaitingQueueSize == 6 && m.RunningRequests == 2 && m.KVCacheUsage == 0.3
	})
}

// Without the server's CA the same target fails verification: TLS is
// verified unless the configuration says otherwise.
func TestScrapeTargetTLSVerifies(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "vllm:num_requests_waiting 1")
	}))
	defer srv.Close()
	ds := endpoints.NewDatastore()
	if err := ds.Replace([]endpoints.Spec{{Name: "a", Address: strings.TrimPrefix(srv.URL, "https://")}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  *tls.Config
		ok   bool
	}{
		{"verified, unknown CA", &tls.Config{MinVersion: tls.VersionTLS12}, false},
		{"insecureSkipVerify", &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, true}, //nolint:gosec // the setting under test
	} {
		s := New(ds, Config{Interval: time.Second, Timeout: 5 * time.Second, Target: Target{Scheme: "https", TLS: tc.tls}})
		e := ds.Get("a")
		err := s.scrapeOnce(context.Background(), e, s.metricsURL(e), nil)
		if (err == nil) != tc.ok {
			t.Fatalf("%s: err = %v", tc.name, err)
		}
	}
}

// ParseWith never panics and never publishes a negative or non-finite load.
func FuzzParseWith(f *testing.F) {
	f.Add([]byte("nv_trt_llm_request_metrics{request_type=\"waiting\"} 7\n"), "nv_trt_llm_request_metrics{request_type=waiting}")
	f.Add(readFixture(f, "vllm.txt"), "vllm:num_requests_waiting")
	f.Fuzz(func(t *testing.T, page []byte, spec string) {
		sel, err := ParseSelector(spec)
		if err != nil {
			return
		}
		m, err := ParseWith(page, &Schema{Queue: sel, Running: sel, KVUsage: sel, CacheInfo: sel, CacheBlockSizeLabel: "block_size", LoRA: sel})
		if err != nil {
			return
		}
		if m.WaitingQueueSize < 0 || m.RunningRequests < 0 || m.KVCacheUsage < 0 || m.KVCacheUsage > 1 {
			t.Fatalf("metrics %+v", m)
		}
	})
}
