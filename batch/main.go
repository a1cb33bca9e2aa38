package batch

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/batch/async"
	"github.com/kvgate/kvgate/internal/cliflag"
)

// Options are `kvgate batch`'s flags.
type Options struct {
	Listen              string
	Gateway             string
	DataDir             string
	RedisURL            string
	TenantHeader        string
	Objective           string
	Jobs                int
	MaxConcurrency      int
	MaxModelConcurrency int
	MaxFileBytes        int64
	MaxLines            int
	MaxAttempts         int
	RetryBase           time.Duration
	RetryMax            time.Duration
	LeaseTTL            time.Duration
	RequestTimeout      time.Duration
	// AsyncQueue, when set, sends requests through the async processor's
	// request sorted set in AsyncRedisURL (default RedisURL) instead of to
	// Gateway.
	AsyncQueue    string
	AsyncRedisURL string
}

// DefaultOptions are the flags' defaults (llm-d batch-gateway's limits:
// 200 MiB and 50,000 lines a file; its tenant header).
func DefaultOptions() Options {
	return Options{
		Listen: ":8000", DataDir: "kvgate-batch", TenantHeader: "X-MaaS-Username", Objective: "batch",
		Jobs: 4, MaxConcurrency: 64, MaxModelConcurrency: 32, MaxFileBytes: 200 << 20, MaxLines: 50000,
		MaxAttempts: 10, RetryBase: 500 * time.Millisecond, RetryMax: 30 * time.Second,
		LeaseTTL: 30 * time.Second, RequestTimeout: 10 * time.Minute,
	}
}

func (o *Options) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "address of the OpenAI Files and Batch API")
	fs.StringVar(&o.Gateway, "gateway", o.Gateway, "base URL requests are sent to: the kvgate gateway (or Envoy) in front of the picker (required)")
	fs.StringVar(&o.DataDir, "data-dir", o.DataDir, "files, job journals and (without --redis-url) the embedded database; a filesystem all replicas share with --redis-url")
	fs.StringVar(&o.RedisURL, "redis-url", o.RedisURL, "Redis or Valkey (redis://host:port/db) for the job queue and records, in llm-d's llmd_batch:* layout; empty: embedded bbolt database in --data-dir")
	fs.StringVar(&o.TenantHeader, "tenant-header", o.TenantHeader, "request header naming the tenant that owns files and batches; sent on as the fairness id")
	fs.StringVar(&o.Objective, "inference-objective", o.Objective, "InferenceObjective sent with every request (x-llm-d-inference-objective); give it a negative (sheddable) priority; empty: none")
	fs.IntVar(&o.Jobs, "jobs", o.Jobs, "batches processed at once")
	fs.IntVar(&o.MaxConcurrency, "max-concurrency", o.MaxConcurrency, "requests in flight, all batches together")
	fs.IntVar(&o.MaxModelConcurrency, "max-model-concurrency", o.MaxModelConcurrency, "requests in flight to one model, all batches together")
	fs.Int64Var(&o.MaxFileBytes, "max-file-bytes", o.MaxFileBytes, "largest upload")
	fs.IntVar(&o.MaxLines, "max-lines", o.MaxLines, "most requests in a batch")
	fs.IntVar(&o.MaxAttempts, "max-attempts", o.MaxAttempts, "tries of a request refused with 429/503 or unanswered; the last answer (or error) is its result")
	fs.DurationVar(&o.RetryBase, "retry-base", o.RetryBase, "first backoff after a refusal; doubles, with jitter")
	fs.DurationVar(&o.RetryMax, "retry-max", o.RetryMax, "longest backoff")
	fs.DurationVar(&o.LeaseTTL, "lease-ttl", o.LeaseTTL, "how long a crashed processor's batches wait before another takes them over (Redis mode)")
	fs.DurationVar(&o.RequestTimeout, "request-timeout", o.RequestTimeout, "bound on one request to the gateway")
	fs.StringVar(&o.AsyncQueue, "async-queue", o.AsyncQueue, "send requests through `kvgate async`'s request sorted set of this name (its gates release them into the fleet's slack) instead of to --gateway")
	fs.StringVar(&o.AsyncRedisURL, "async-redis-url", o.AsyncRedisURL, "Redis of --async-queue (default --redis-url)")
}

// Args is the command line that gives these options.
func (o Options) Args() []string {
	set, def := flag.NewFlagSet("", flag.ContinueOnError), flag.NewFlagSet("", flag.ContinueOnError)
	o.flags(set)
	d := DefaultOptions()
	d.flags(def)
	return cliflag.Args(set, def)
}

// ParseFlags parses `kvgate batch`'s arguments.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("kvgate batch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		return o, err
	}
	return o, o.validate()
}

func (o Options) validate() error {
	switch {
	case o.AsyncQueue != "" && o.Gateway != "":
		return errors.New("--gateway and --async-queue exclude each other: with --async-queue the async processor sends the requests")
	case o.AsyncQueue != "" && o.AsyncRedisURL == "" && o.RedisURL == "":
		return errors.New("--async-queue needs --async-redis-url (or --redis-url)")
	case o.AsyncQueue == "" && o.AsyncRedisURL != "":
		return errors.New("--async-redis-url needs --async-queue")
	case o.AsyncQueue == "" && o.Gateway == "":
		return errors.New("--gateway (or --async-queue) is required")
	}
	if u, err := url.Parse(o.Gateway); o.AsyncQueue == "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		return fmt.Errorf("--gateway %q: want an http(s) URL", o.Gateway)
	}
	switch {
	case o.DataDir == "":
		return errors.New("--data-dir is required")
	case o.Jobs < 1, o.MaxConcurrency < 1, o.MaxModelConcurrency < 1, o.MaxLines < 1, o.MaxAttempts < 1:
		return errors.New("--jobs, --max-concurrency, --max-model-concurrency, --max-lines and --max-attempts must be at least 1")
	case o.MaxFileBytes < 1:
		return errors.New("--max-file-bytes must be positive")
	case o.RetryBase <= 0 || o.RetryMax < o.RetryBase:
		return errors.New("--retry-base must be positive and at most --retry-max")
	case o.LeaseTTL < 300*time.Millisecond:
		return errors.New("--lease-ttl must be at least 300ms")
	case o.TenantHeader == "":
		return errors.New("--tenant-header must name a header")
	}
	return nil
}

// Main runs `kvgate batch`.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	o, err := ParseFlags(args, stderr)
	if err != nil {
		return err
	}
	return Run(ctx, o, slog.New(slog.NewTextHandler(stderr, nil)))
}

// Run serves the API and processes batches until ctx ends.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	var store Store
	var err error
	if o.RedisURL != "" {
		store, err = openRedis(ctx, o.RedisURL)
	} else {
		store, err = openBolt(filepath.Join(o.DataDir, "batch.db"))
	}
	if err != nil {
		return err
	}
	defer store.Close()
	blobs, err := newBlobs(filepath.Join(o.DataDir, "files"))
	if err != nil {
		return err
	}
	owner := make([]byte, 8)
	_, _ = rand.Read(owner)
	host, _ := os.Hostname()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var dispatcher Dispatcher = &HTTPDispatcher{Base: o.Gateway, Objective: o.Objective, Client: &http.Client{Timeout: o.RequestTimeout}}
	if o.AsyncQueue != "" {
		opt, err := redis.ParseURL(cmp.Or(o.AsyncRedisURL, o.RedisURL))
		if err != nil {
			return fmt.Errorf("--async-redis-url: %w", err)
		}
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		c := async.NewClient(rdb, async.ClientOptions{Queue: o.AsyncQueue, Logger: log})
		defer c.Close()
		dispatcher = &AsyncDispatcher{Client: c, Objective: o.Objective}
	}
	proc, err := NewProcessor(ProcessorConfig{
		Store: store, Blobs: blobs, JournalDir: filepath.Join(o.DataDir, "journals"),
		Dispatcher: dispatcher,
		Owner:      fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(owner)), LeaseTTL: o.LeaseTTL,
		Jobs: o.Jobs, MaxConcurrency: o.MaxConcurrency, MaxModelConcurrency: o.MaxModelConcurrency, MaxLines: o.MaxLines,
		MaxAttempts: o.MaxAttempts, RetryBase: o.RetryBase, RetryMax: o.RetryMax, Logger: log, Registry: reg,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	srv := &http.Server{Handler: NewServer(ServerConfig{Store: store, Blobs: blobs, TenantHeader: o.TenantHeader,
		MaxFileBytes: o.MaxFileBytes, Logger: log, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}), ReadHeaderTimeout: 30 * time.Second}
	mode := "embedded"
	if o.RedisURL != "" {
		mode = "redis"
	}
	log.Info("batch listening", "addr", ln.Addr().String(), "gateway", o.Gateway, "store", mode, "data_dir", o.DataDir)
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Go(func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	})
	runCtx, stop := context.WithCancel(ctx)
	wg.Go(func() { _ = proc.Run(runCtx) })
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stop()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	wg.Wait()
	if err != nil {
		return err
	}
	return ctx.Err()
}
