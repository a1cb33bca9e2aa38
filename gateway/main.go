package gateway

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"time"
)

// Main is the `kvgate gateway` command: args are its flags, ctx ends it
// (graceful shutdown).
func Main(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "address to serve HTTP/1.1 and h2c on")
	extProc := fs.String("extproc", "127.0.0.1:9002", "endpoint picker ext_proc gRPC address (empty: none, all traffic to --fallback-endpoint)")
	wasmPath := fs.String("wasm", "bin/kvgate-filter.wasm", "proxy-wasm filter module (empty: no filter)")
	wasmConfig := fs.String("wasm-config", "", "filter plugin configuration: JSON, or @file")
	wasmVMConfig := fs.String("wasm-vm-config", "", `filter VM configuration: JSON, or @file (precise mode: {"tokenizer":<tokenizer.json>,"tokenizerConfig":<tokenizer_config.json>})`)
	wasmVMs := fs.Int("wasm-vms", runtime.GOMAXPROCS(0), "filter VMs (one per worker, as in Envoy)")
	failOpen := fs.Bool("failure-mode-allow", false, "when the picker fails, continue to --fallback-endpoint instead of answering 500")
	reqMode := fs.String("request-body-mode", "full-duplex-streamed", "request body to the picker: full-duplex-streamed | none (headers only, with the filter)")
	respMode := fs.String("response-body-mode", "full-duplex-streamed", "response body to the picker: full-duplex-streamed | none")
	extProcTimeout := fs.Duration("extproc-timeout", 10*time.Second, "longest wait for one picker message")
	upstreamTimeout := fs.Duration("upstream-timeout", 0, "bound on a whole upstream exchange (0: none)")
	fallback := fs.String("fallback-endpoint", "", "comma list of ip:port for fail-open traffic")
	maxBuffer := fs.Int("max-request-buffer", 16<<20, "request body bytes held for the filter or a fail-open replay")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("gateway: unexpected arguments %q", fs.Args())
	}
	cfg := Config{
		ExtProc:          *extProc,
		WasmVMs:          *wasmVMs,
		FailureModeAllow: *failOpen,
		ExtProcTimeout:   *extProcTimeout,
		UpstreamTimeout:  *upstreamTimeout,
		Fallback:         splitEndpoints(*fallback),
		MaxRequestBuffer: *maxBuffer,
		Logger:           slog.Default(),
	}
	var err error
	if cfg.RequestBodyMode, err = ParseBodyMode(*reqMode); err != nil {
		return fmt.Errorf("gateway: --request-body-mode: %w", err)
	}
	if cfg.ResponseBodyMode, err = ParseBodyMode(*respMode); err != nil {
		return fmt.Errorf("gateway: --response-body-mode: %w", err)
	}
	for _, ep := range cfg.Fallback {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			return fmt.Errorf("gateway: --fallback-endpoint %q: %w", ep, err)
		}
	}
	if *wasmPath != "" {
		if cfg.Wasm, err = os.ReadFile(*wasmPath); err != nil {
			return fmt.Errorf("gateway: --wasm: %w", err)
		}
		if cfg.WasmConfig, err = readInline(*wasmConfig); err != nil {
			return fmt.Errorf("gateway: --wasm-config: %w", err)
		}
		if cfg.WasmVMConfig, err = readInline(*wasmVMConfig); err != nil {
			return fmt.Errorf("gateway: --wasm-vm-config: %w", err)
		}
	}
	g, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	defer g.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	cfg.Logger.Info("gateway listening", "addr", ln.Addr().String(), "extproc", cfg.ExtProc,
		"wasm", *wasmPath, "request_body_mode", *reqMode, "failure_mode_allow", cfg.FailureModeAllow)
	return Serve(ctx, ln, g)
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
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           h,
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn),
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
