package async

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/cliflag"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Main is `kvgate async`, with llm-d-async's flags (the redis-sortedset
// transport). args exclude the subcommand name.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvgate async", flag.ContinueOnError)
	fs.SetOutput(stderr)
	transport := fs.String("transport", "redis-sortedset", "message transport; kvgate implements redis-sortedset")
	inline := fs.String("transport-config", "", "transport configuration JSON (url, result_queue_name, retry_queue_name, poll_interval_ms, batch_size, queues[])")
	file := fs.String("transport-config-file", "", "file with the transport configuration JSON")
	conc := fs.Int("concurrency", DefaultConcurrency, "concurrent workers (requests in flight)")
	reqTimeout := fs.Duration("request-timeout", DefaultRequestTimeout, "timeout of one inference request (never past its deadline)")
	drain := fs.Duration("drain-timeout", DefaultDrainTimeout, "at shutdown, how long in-flight requests may finish before they are re-queued")
	redeliver := fs.Duration("redelivery-timeout", 0, "a popped message not settled this long (its processor was killed) goes back to its queue (0: 2 × --request-timeout + 30s)")
	promURL := fs.String("prometheus-url", "", "Prometheus server for the prometheus-* gates")
	promTTL := fs.Duration("prometheus-cache-ttl", 5*time.Second, "how long a Prometheus answer is reused (0: not)")
	metricsAddr := fs.String("metrics-addr", ":9090", "Prometheus /metrics listen address")
	metricsPort := fs.Int("metrics-port", 0, "the metrics port on all interfaces (llm-d-async's flag; overrides --metrics-addr)")
	healthPort := fs.Int("health-port", 8081, "port of /healthz and /readyz (0: none)")
	poolFile := fs.String("pool-config-file", "", "worker pools (not supported: kvgate runs one pool, --concurrency workers)")
	level := fs.String("log-level", "info", "debug | info | warn | error")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if *transport != "redis-sortedset" {
		return fmt.Errorf("--transport %q is not supported: kvgate async implements redis-sortedset", *transport)
	}
	if *poolFile != "" {
		return errors.New("--pool-config-file is not supported: kvgate async runs one worker pool (--concurrency workers)")
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	var raw []byte
	switch {
	case *inline != "" && *file != "":
		return errors.New("give one of --transport-config and --transport-config-file")
	case *inline != "":
		raw = []byte(*inline)
	case *file != "":
		b, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		raw = b
	default:
		return errors.New("--transport-config or --transport-config-file is required")
	}
	cfg, err := ParseConfig(raw, os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	if *metricsPort != 0 {
		*metricsAddr = ":" + strconv.Itoa(*metricsPort)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p, err := New(Options{Config: cfg, Concurrency: *conc, RequestTimeout: *reqTimeout, DrainTimeout: *drain, Redelivery: *redeliver,
		Gates: &Factory{PrometheusURL: *promURL, CacheTTL: *promTTL, Now: time.Now}, Registerer: reg, Logger: log})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	type named struct {
		name string
		*http.Server
	}
	servers := []named{{"metrics", &http.Server{Addr: *metricsAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}}}
	if *healthPort != 0 {
		h := http.NewServeMux()
		ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }
		h.HandleFunc("/healthz", ok)
		h.HandleFunc("/readyz", ok)
		servers = append(servers, named{"health", &http.Server{Addr: ":" + strconv.Itoa(*healthPort), Handler: h, ReadHeaderTimeout: 10 * time.Second}})
	}
	for _, s := range servers {
		ln, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return err
		}
		// The bound address, not the flag's: with port 0 this line is how a
		// supervisor (or a test) learns which port the kernel gave.
		log.Info("listening", "server", s.name, "addr", ln.Addr().String())
		go func() { _ = s.Serve(ln) }()
		defer s.Close()
	}
	return p.Run(ctx)
}
