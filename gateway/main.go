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

	"github.com/kvgate/kvgate/internal/cliflag"
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
	fs.IntVar(&o.MaxRequestBuffer, "max-request-buffer", o.MaxRequestBuffer, "request body bytes held for the filter or a fail-open replay")
	return fs
}

// ParseFlags parses `kvgate gateway` arguments.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := o.flagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("gateway: unexpected arguments %q", fs.Args())
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
		Logger:           log,
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
	return Run(ctx, o, slog.New(slog.NewTextHandler(stderr, nil)))
}

// Run builds the gateway o describes, binds --listen and serves until ctx
// ends; everything it started is stopped and released when it returns.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	cfg, err := o.config(log)
	if err != nil {
		return err
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
	return serve(ctx, ln, g, log)
}

// readInline returns v, or the file's contents for "@file".
func readInline(v string) ([]byte, error) {
	if name, ok := strings.CutPrefix(v, "@"); ok {
		return os.ReadFile(name)
	}
	return []byte(v), nil
}

// Serve serves h on ln over HTTP/1.1 and h2c until ctx ends, then shuts
// down gracefully (in-flight streams get 10 s).
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	return serve(ctx, ln, h, slog.Default())
}

func serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           h,
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
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
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
