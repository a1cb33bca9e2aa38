package sidecar

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
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/k8s"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/extproc/epp/tlscert"
	"github.com/kvgate/kvgate/internal/bytebudget"
)

// decoderHost is where the local model server is dialled: it shares the
// pod's network namespace.
const decoderHost = "127.0.0.1"

// shutdownGrace is how long Run lets in-flight responses finish.
const shutdownGrace = 2 * time.Second

// Server is one routing sidecar. New binds its listeners; Run serves until
// its context ends.
//
// Ownership: each request's handler goroutine owns its legs and its
// response; an offloading prefill leg that outlives its request runs on
// the server's context and is awaited by Run (bg).
type Server struct {
	o         Options
	log       *slog.Logger
	ln        net.Listener
	metricsLn net.Listener // nil without --metrics-port
	srv       *http.Server
	msrv      *http.Server
	decoder   *url.URL
	prefillC  *http.Client
	decodeC   *http.Client
	encodeC   *http.Client
	pass      *httputil.ReverseProxy
	pool      *pool
	reg       *prometheus.Registry
	m         *metrics
	replay    *bytebudget.Budget // relayed bodies kept for a replay; nil: none kept
	bodies    *bytebudget.Budget // P/D request bodies being rewritten into legs
	prefix    map[string]string  // URL scheme per stage
	// prefillers bounds the P/D pair metric's prefiller label.
	prefillers labelSet

	ctx    context.Context // the server's lifetime
	cancel context.CancelFunc
	bg     sync.WaitGroup

	rngMu sync.Mutex
	rng   *rand.Rand
}

// New validates o, builds the pool source and binds the listeners.
func New(o Options) (*Server, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{o: o, log: o.Logger.With("component", "sidecar"), rng: rand.New(rand.NewPCG(rand.Uint64(), 0)), prefillers: labelSet{max: maxPrefillerLabels}}
	var src endpoints.Source
	if o.EnableSSRFProtection {
		var err error
		if src, err = poolSource(o, s.log); err != nil {
			return nil, err
		}
	} else {
		s.log.Warn("SSRF protection is off: prefill, encode and KV-source targets taken from request headers are not checked against the pool")
	}
	s.pool = newPool(src)
	s.prefix = map[string]string{stagePrefiller: "http://", stageDecoder: "http://", stageEncoder: "http://"}
	for st := range s.prefix {
		if o.tls(st) {
			s.prefix[st] = "https://"
		}
	}
	if o.ReplayBufferBytes > 0 {
		s.replay = bytebudget.New(o.ReplayBufferBytes)
	}
	s.bodies = bytebudget.New(o.BodyBudgetBytes)
	s.reg = prometheus.NewRegistry()
	s.m = newMetrics(s.reg, s.replay, s.bodies)
	s.decoder = &url.URL{Scheme: strings.TrimSuffix(s.prefix[stageDecoder], "://"), Host: net.JoinHostPort(decoderHost, strconv.Itoa(o.ModelServerPort))}
	s.prefillC = &http.Client{Transport: s.transport(stagePrefiller)}
	s.decodeC = &http.Client{Transport: s.transport(stageDecoder)}
	s.encodeC = &http.Client{Transport: s.transport(stageEncoder)}
	s.pass = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(s.decoder)
			pr.Out.Host = pr.In.Host
		},
		Transport:     s.decodeC.Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil {
				s.log.Warn("model server unreachable", "err", err)
				writeError(w, errDecoderDown())
			}
		},
		// Its log is a relayed answer cut short (the client sees the
		// connection aborted): worth a warning.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}

	var err error
	if s.ln, err = net.Listen("tcp", net.JoinHostPort(o.Host, strconv.Itoa(o.Port))); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if o.MetricsPort > 0 {
		if s.metricsLn, err = net.Listen("tcp", net.JoinHostPort(o.Host, strconv.Itoa(o.MetricsPort))); err != nil {
			s.ln.Close()
			return nil, fmt.Errorf("listen --metrics-port: %w", err)
		}
	}
	if o.SecureServing {
		cfg, err := tlscert.ServerConfig(tlscert.Options{CertPath: o.CertPath})
		if err != nil {
			s.closeListeners()
			return nil, fmt.Errorf("--secure-serving: %w", err)
		}
		s.ln = tls.NewListener(s.ln, cfg)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	if s.metricsLn != nil {
		s.msrv = &http.Server{Handler: promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	}
	return s, nil
}

// poolSource is the membership source behind SSRF protection: the
// picker's static file or its Kubernetes discovery of the InferencePool.
func poolSource(o Options, log *slog.Logger) (endpoints.Source, error) {
	if o.EndpointsFile != "" {
		return &staticfile.File{Path: o.EndpointsFile, Logger: log}, nil
	}
	ns, name, ok := strings.Cut(o.InferencePool, "/")
	if !ok {
		ns, name = "default", o.InferencePool
	}
	if ns == "" || name == "" {
		return nil, fmt.Errorf("--inference-pool %q: want namespace/name or name", o.InferencePool)
	}
	d, err := k8s.New(k8s.Options{PoolName: name, PoolNamespace: ns, Kubeconfig: o.Kubeconfig, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--inference-pool %s: %w", o.InferencePool, err)
	}
	return d, nil
}

// upstreamIdleTimeout is how long an idle upstream connection is kept: under
// vLLM's own keep-alive (its API server closes a connection idle for
// VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default), so the sidecar, not the
// server, ends idle connections. A request written whole to a connection
// the server was closing is not replayed (staleRetry), so the sidecar must
// not leave that race to the server's clock.
const upstreamIdleTimeout = 4 * time.Second

// transport dials one stage's upstreams, replaying a request that a
// stale keep-alive connection failed (staleRetry).
func (s *Server) transport(stage string) http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 0
	t.MaxIdleConnsPerHost = s.o.MaxIdleConnsPerHost
	t.IdleConnTimeout = upstreamIdleTimeout
	if s.o.tls(stage) {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: s.o.skipVerify(stage)} //nolint:gosec // the operator's choice, per stage
	}
	fresh := t.Clone()
	fresh.DisableKeepAlives = true
	return &staleRetry{pooled: t, fresh: fresh, max: s.o.MaxRequestBodyBytes, keep: s.replay, full: s.m.replayFull, log: s.log.With("stage", stage)}
}

func (s *Server) closeListeners() {
	s.ln.Close()
	if s.metricsLn != nil {
		s.metricsLn.Close()
	}
}

// Addr is the proxy's bound address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// MetricsAddr is the bound --metrics-port address, nil when off.
func (s *Server) MetricsAddr() net.Addr {
	if s.metricsLn == nil {
		return nil
	}
	return s.metricsLn.Addr()
}

// Registry holds the sidecar's metrics.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Handler is the proxy: GET /health, the intercepted POST paths, and
// every other request straight to the local model server.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, a := range apis {
		mux.HandleFunc("POST "+a.path, s.handle(a))
	}
	mux.HandleFunc("/", s.passThrough)
	return mux
}

// passThrough relays r to the local model server untouched.
//
// The model server may answer before the transport has finished with the
// client's body: vLLM and `kvgate sim` send a stream's headers as soon as
// they have read the body, while the transport still reads the client's
// body to its EOF. An HTTP/1 server closes an unfinished request body when
// the handler writes its header, so without full duplex that last read
// failed, the transport closed the model server's connection and the
// answer was cut after its 200 header (issue 16).
func (s *Server) passThrough(w http.ResponseWriter, r *http.Request) {
	_ = http.NewResponseController(w).EnableFullDuplex() // HTTP/2 is full duplex already
	s.pass.ServeHTTP(w, r)
}

// abortResponse ends a response whose upstream failed after its header
// went out: the connection is cut (HTTP/1: no terminating chunk, or fewer
// bytes than the Content-Length; HTTP/2: RST_STREAM), so that the client
// sees the failure instead of a complete-looking, truncated answer.
func (s *Server) abortResponse(r *http.Request, stage string, err error) {
	if r.Context().Err() == nil {
		s.m.errors.WithLabelValues(s.o.KVConnector, stage).Inc()
		s.log.Warn("model server answer cut short; aborting the response", "err", err, "path", r.URL.Path)
	}
	panic(http.ErrAbortHandler)
}

// Run serves until ctx ends or the pool source fails.
func (s *Server) Run(ctx context.Context) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 3)
	go func() { errc <- s.pool.run(ctx, s.log) }()
	go func() { errc <- s.srv.Serve(s.ln) }()
	if s.msrv != nil {
		go func() { errc <- s.msrv.Serve(s.metricsLn) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
	}
	stop()
	shut, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	_ = s.srv.Shutdown(shut)
	if s.msrv != nil {
		_ = s.msrv.Shutdown(shut)
	}
	s.cancel()
	s.bg.Wait()
	s.closeListeners()
	// Idle keep-alive connections would otherwise stay open, each with
	// its reader goroutine, until IdleConnTimeout.
	for _, c := range []*http.Client{s.prefillC, s.decodeC, s.encodeC} {
		c.CloseIdleConnections()
	}
	return err
}

// newRequestID is the x-request-id both legs carry.
func newRequestID() string { return uuid.NewString() }

func (s *Server) intn(n int) int {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.IntN(n)
}

// hopHeaders are not forwarded (RFC 9110 §7.6.1), nor Accept-Encoding on
// legs whose response the sidecar reads: it must see plain JSON.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Accept-Encoding"}

// newLeg builds one leg of a request to target (a URL): the client's
// method and headers, b as body, x-request-id set to id.
func newLeg(ctx context.Context, r *http.Request, target, id string, b []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, r.Method, target, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header = r.Header.Clone()
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	req.Header.Del("Content-Length")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	req.ContentLength = int64(len(b))
	req.Host = r.Host
	return req, nil
}

// copyResponse writes resp to w, flushing as the body arrives (SSE).
func copyResponse(w http.ResponseWriter, resp *http.Response) error {
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = append([]string(nil), vs...)
	}
	for _, k := range hopHeaders[:len(hopHeaders)-1] {
		h.Del(k)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			} else {
				_ = rc.Flush()
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
