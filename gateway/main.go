package gateway

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
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/bytebudget"
	"github.com/kvgate/kvgate/internal/cliflag"
	"github.com/kvgate/kvgate/internal/memlimit"
)

// Options are `kvgate gateway`'s flags, one field per flag.
type Options struct {
	Listen           string
	ExtProc          string
	WasmPath         string
	WasmConfig       string
	WasmVMConfig     string
	WasmVMs          int
	FailureModeAllow bool
	RequestBodyMode  string
	ResponseBodyMode string
	ExtProcTimeout   time.Duration
	UpstreamTimeout  time.Duration
	// Fallback is a comma list of ip:port.
	Fallback         string
	MaxRequestBuffer int
	BodyBudgetBytes  int64
	// MemoryLimit is the Go soft memory limit Main applies (memlimit.Auto:
	// the body budget plus memlimit.Headroom; 0: none); GOMEMLIMIT wins.
	MemoryLimit           int64
	BodyIdleTimeout       time.Duration
	UpstreamIdleTimeout   time.Duration
	MaxRequestHeaders     int
	MaxRequestHeaderBytes int
	// BlockedPaths is a comma list; empty blocks nothing.
	BlockedPaths       string
	TrustClientRewrite bool
	PickerReconnectMax time.Duration
	// BodyBasedRouting runs GIE's Body-Based Router step (bbr.go).
	BodyBasedRouting bool
	// MetricsAddr serves /metrics (BBR's families); empty: none.
	MetricsAddr string
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		Listen:           ":8080",
		ExtProc:          "127.0.0.1:9002",
		WasmPath:         "bin/kvgate-filter.wasm",
		WasmVMs:          runtime.GOMAXPROCS(0),
		RequestBodyMode:  "full-duplex-streamed",
		ResponseBodyMode: "full-duplex-streamed",
		ExtProcTimeout:   10 * time.Second,
		MaxRequestBuffer: 16 << 20,

		BodyBudgetBytes:       DefaultBodyBudgetBytes,
		MemoryLimit:           memlimit.Auto,
		BodyIdleTimeout:       DefaultBodyIdleTimeout,
		UpstreamIdleTimeout:   DefaultUpstreamIdleTimeout,
		MaxRequestHeaders:     DefaultMaxRequestHeaders,
		MaxRequestHeaderBytes: DefaultMaxRequestHeaderBytes,
		BlockedPaths:          strings.Join(DefaultBlockedPaths, ","),
		PickerReconnectMax:    DefaultPickerReconnectMax,
	}
}

// flagSet binds a flag set to o's fields; ParseFlags and Args share it, so
// the flags Args writes are the flags ParseFlags reads.
func (o *Options) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Listen, "listen", o.Listen, "address to serve HTTP/1.1 and h2c on")
	fs.StringVar(&o.ExtProc, "extproc", o.ExtProc, "endpoint picker ext_proc gRPC address (empty: none, all traffic to --fallback-endpoint)")
	fs.StringVar(&o.WasmPath, "wasm", o.WasmPath, "proxy-wasm filter module (empty: no filter)")
	fs.StringVar(&o.WasmConfig, "wasm-config", o.WasmConfig, "filter plugin configuration: JSON, or @file")
	fs.StringVar(&o.WasmVMConfig, "wasm-vm-config", o.WasmVMConfig, `filter VM configuration: JSON, or @file (precise mode: {"tokenizer":<tokenizer.json>,"tokenizerConfig":<tokenizer_config.json>})`)
	fs.IntVar(&o.WasmVMs, "wasm-vms", o.WasmVMs, "filter VMs (one per worker, as in Envoy)")
	fs.BoolVar(&o.FailureModeAllow, "failure-mode-allow", o.FailureModeAllow, "when the picker fails, continue to --fallback-endpoint instead of answering 500")
	fs.StringVar(&o.RequestBodyMode, "request-body-mode", o.RequestBodyMode, "request body to the picker: full-duplex-streamed | none (headers only, with the filter)")
	fs.StringVar(&o.ResponseBodyMode, "response-body-mode", o.ResponseBodyMode, "response body to the picker: full-duplex-streamed | none")
	fs.DurationVar(&o.ExtProcTimeout, "extproc-timeout", o.ExtProcTimeout, "longest wait for one picker message")
	fs.DurationVar(&o.UpstreamTimeout, "upstream-timeout", o.UpstreamTimeout, "bound on a whole upstream exchange (0: none)")
	fs.StringVar(&o.Fallback, "fallback-endpoint", o.Fallback, "comma list of ip:port for fail-open traffic")
	fs.IntVar(&o.MaxRequestBuffer, "max-request-buffer", o.MaxRequestBuffer, "request body bytes held for the filter")
	fs.Int64Var(&o.BodyBudgetBytes, "body-budget-bytes", o.BodyBudgetBytes, "request body bytes all requests together may hold; beyond it new bodies get 503 (<0: unlimited)")
	fs.Var(memlimit.Value{N: &o.MemoryLimit}, "memory-limit", "Go soft memory limit (bytes, or with KiB/MiB/GiB): auto = --body-budget-bytes + 256 MiB (none if the budget is unlimited), 0 = none; GOMEMLIMIT in the environment wins")
	fs.DurationVar(&o.BodyIdleTimeout, "body-idle-timeout", o.BodyIdleTimeout, "longest pause in a client's request body before 408 (<0: none)")
	fs.DurationVar(&o.UpstreamIdleTimeout, "upstream-idle-timeout", o.UpstreamIdleTimeout, "longest time an upstream exchange may make no progress either way (<0: none)")
	fs.IntVar(&o.MaxRequestHeaders, "max-request-headers", o.MaxRequestHeaders, "most request header values before 431 (Envoy's max_headers_count)")
	fs.IntVar(&o.MaxRequestHeaderBytes, "max-request-header-bytes", o.MaxRequestHeaderBytes, "most request header bytes before 431 (Envoy's max_request_headers_kb)")
	fs.StringVar(&o.BlockedPaths, "blocked-paths", o.BlockedPaths, "comma list of request paths answered 403 instead of forwarded (model servers' admin endpoints); empty: none")
	fs.BoolVar(&o.TrustClientRewrite, "trust-client-model-rewrite", o.TrustClientRewrite, "keep client-sent x-gateway-model-name-rewrite / x-llm-d-model-name-rewrite headers (default: removed)")
	fs.BoolVar(&o.BodyBasedRouting, "body-based-routing", o.BodyBasedRouting, "set X-Gateway-Model-Name from the body's model before the picker, as GIE's Body-Based Router does (bbr_* metrics)")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "address to serve Prometheus /metrics on (empty: none)")
	fs.DurationVar(&o.PickerReconnectMax, "extproc-reconnect-max", o.PickerReconnectMax, "longest back-off between attempts to reach an unreachable picker")
	return fs
}

// ParseFlags parses `kvgate gateway` arguments.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := o.flagSet(stderr)
	if err := cliflag.Parse(fs, args); err != nil {
		return o, err
	}
	return o, nil
}

// Args is the command line (after `kvgate gateway`) that parses back to o:
// the flags whose values differ from the defaults.
func (o Options) Args() []string {
	def := DefaultOptions()
	return cliflag.Args(o.flagSet(io.Discard), def.flagSet(io.Discard))
}

// config checks o and reads the files it names into a Config.
func (o Options) config(log *slog.Logger) (Config, error) {
	cfg := Config{
		ExtProc:          o.ExtProc,
		WasmVMs:          o.WasmVMs,
		FailureModeAllow: o.FailureModeAllow,
		ExtProcTimeout:   o.ExtProcTimeout,
		UpstreamTimeout:  o.UpstreamTimeout,
		Fallback:         splitEndpoints(o.Fallback),
		MaxRequestBuffer: o.MaxRequestBuffer,
		BodyBudget:       bytebudget.New(o.BodyBudgetBytes),
		BodyIdleTimeout:  negativeForZero(o.BodyIdleTimeout),

		UpstreamIdleTimeout:   negativeForZero(o.UpstreamIdleTimeout),
		MaxRequestHeaders:     o.MaxRequestHeaders,
		MaxRequestHeaderBytes: o.MaxRequestHeaderBytes,
		BlockedPaths:          []string{},
		TrustClientRewrite:    o.TrustClientRewrite,
		PickerReconnectMax:    o.PickerReconnectMax,
		Logger:                log,
	}
	for p := range strings.SplitSeq(o.BlockedPaths, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if !strings.HasPrefix(p, "/") {
				return cfg, fmt.Errorf("gateway: --blocked-paths %q: a path starts with /", p)
			}
			cfg.BlockedPaths = append(cfg.BlockedPaths, p)
		}
	}
	if o.BodyBudgetBytes == 0 {
		return cfg, errors.New("gateway: --body-budget-bytes 0 would refuse every body; use a negative value for no limit")
	}
	if o.MaxRequestHeaders <= 0 || o.MaxRequestHeaderBytes <= 0 || o.PickerReconnectMax <= 0 {
		return cfg, errors.New("gateway: --max-request-headers, --max-request-header-bytes and --extproc-reconnect-max must be positive")
	}
	var err error
	if cfg.RequestBodyMode, err = ParseBodyMode(o.RequestBodyMode); err != nil {
		return cfg, fmt.Errorf("gateway: --request-body-mode: %w", err)
	}
	if cfg.ResponseBodyMode, err = ParseBodyMode(o.ResponseBodyMode); err != nil {
		return cfg, fmt.Errorf("gateway: --response-body-mode: %w", err)
	}
	for _, ep := range cfg.Fallback {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			return cfg, fmt.Errorf("gateway: --fallback-endpoint %q: %w", ep, err)
		}
	}
	if o.WasmPath != "" {
		if cfg.Wasm, err = os.ReadFile(o.WasmPath); err != nil {
			return cfg, fmt.Errorf("gateway: --wasm: %w", err)
		}
		if cfg.WasmConfig, err = readInline(o.WasmConfig); err != nil {
			return cfg, fmt.Errorf("gateway: --wasm-config: %w", err)
		}
		if cfg.WasmVMConfig, err = readInline(o.WasmVMConfig); err != nil {
			return cfg, fmt.Errorf("gateway: --wasm-vm-config: %w", err)
		}
	}
	return cfg, nil
}

// Main is the `kvgate gateway` command: args are its flags, ctx ends it
// (graceful shutdown). It logs to stderr and writes nothing to stdout.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	o, err := ParseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	limit, src := o.ApplyMemoryLimit(os.Getenv)
	log.Info("memory limit", "bytes", limit, "from", src)
	return Run(ctx, o, log)
}

// ApplyMemoryLimit sets the process's Go memory limit from --memory-limit
// (see internal/memlimit) and returns the limit in force and where it came
// from. It is process-wide, so Main calls it, not Run.
func (o Options) ApplyMemoryLimit(getenv func(string) string) (int64, memlimit.Source) {
	return memlimit.Apply(memlimit.Resolve(o.MemoryLimit, o.BodyBudgetBytes), getenv)
}

// Run builds the gateway o describes, binds --listen and serves until ctx
// ends; everything it started is stopped and released when it returns.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	cfg, err := o.config(log)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if o.BodyBasedRouting {
		if cfg.BodyBasedRouting, err = NewBBRMetrics(reg); err != nil {
			return err
		}
	}
	if o.MetricsAddr != "" {
		mln, err := net.Listen("tcp", o.MetricsAddr)
		if err != nil {
			return fmt.Errorf("gateway: --metrics-addr: %w", err)
		}
		ms := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = ms.Serve(mln) }()
		defer ms.Close()
		log.Info("gateway metrics", "addr", mln.Addr().String())
	}
	g, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	defer g.Close()
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	log.Info("gateway listening", "addr", ln.Addr().String(), "extproc", cfg.ExtProc,
		"wasm", o.WasmPath, "request_body_mode", o.RequestBodyMode, "failure_mode_allow", cfg.FailureModeAllow)
	return serve(ctx, ln, g, log, o.MaxRequestHeaderBytes)
}

// negativeForZero maps a flag's 0 ("none") to Config's "none" (negative):
// in Config, zero takes the default.
func negativeForZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// readInline returns v, or the file's contents for "@file".
func readInline(v string) ([]byte, error) {
	if name, ok := strings.CutPrefix(v, "@"); ok {
		return os.ReadFile(name)
	}
	return []byte(v), nil
}

// Serve serves h on ln over HTTP/1.1 and h2c until ctx ends, then shuts
// down gracefully: in-flight streams get 10 s, then are cut.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	return serve(ctx, ln, h, slog.Default(), DefaultMaxRequestHeaderBytes)
}

// serve serves h; maxHeaderBytes is the header limit the handler checks,
// and net/http refuses (431) what is far above it before the handler runs,
// so a header flood is not even parsed whole.
func serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger, maxHeaderBytes int) error {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           h,
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
		// Room for the request line and the per-header overhead net/http
		// counts on top of names and values.
		MaxHeaderBytes: 2*maxHeaderBytes + 8<<10,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Past the grace the requests left are cut: the caller releases
		// the Gateway once serve returns, which must not be under them.
		_ = srv.Close()
		<-errc
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
