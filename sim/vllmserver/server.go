package vllmserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/tokenizer"
	"github.com/kvgate/kvgate/sim/engine"
)

// maxReleaseCalls bounds the in-flight release notifications a decoder
// sends to prefillers; beyond it a prefiller's held-block timeout frees
// the blocks instead.
const maxReleaseCalls = 64

// shutdownGrace is how long Run lets in-flight responses finish.
const shutdownGrace = 2 * time.Second

// Server is one simulated vLLM pod: HTTP API, engine, metrics and KV
// events. New binds its listener; Run serves until its context ends.
//
// Ownership: the engine belongs to the Runner (its own lock); each
// request's handler goroutine owns that request's stream and response;
// rng and counters have their own locks; the release goroutines are
// bounded by relSem and awaited by Close.
type Server struct {
	opts    Options
	log     *slog.Logger
	tok     *tokenizer.Tokenizer
	enc     *tokenizer.PrefixCache
	runner  *engine.Runner
	engCfg  engine.Config
	models  modelTable
	pub     *kvwire.Publisher // nil without KV events
	topic   string
	reg     *prometheus.Registry
	metrics *serverMetrics
	ln      net.Listener
	http    *http.Server
	peers   *peerGuard   // every dial a request body names
	client  *http.Client // release notifications to prefillers (a peer client)
	host    string       // advertised host of remote_host and the topic
	port    int
	engID   string       // remote_engine_id
	dp      *dataPlane   // nil without --agent
	kvc     *kvConnector // SharedStorageConnector or OffloadingConnector; nil otherwise

	// E/P/D: the encoder outputs this server holds, how many items used an
	// encode server's output, the model's hidden size (an output's size)
	// and the placeholder token an encoder pass runs over.
	encCache encoderCache
	encoded  atomic.Uint64
	hidden   int
	padToken int

	ctx       context.Context // the server's lifetime; request contexts derive from it
	cancel    context.CancelFunc
	relSem    chan struct{}
	relWG     sync.WaitGroup
	relMu     sync.Mutex // orders relWG.Go after Close's Wait
	relClosed bool

	rngMu sync.Mutex
	rng   *rand.Rand

	closeOnce sync.Once
	closeErr  error
}

// New builds a server and binds its HTTP listener (and a bound KV-events
// socket), so that a caller using port 0 can read the addresses before Run.
func New(o Options) (*Server, error) {
	v, err := o.validate()
	if err != nil {
		return nil, err
	}
	kvc := v.kvc
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{opts: o, log: o.Logger.With("component", "sim"), tok: o.Tokenizer,
		rng: rand.New(rand.NewPCG(o.Seed, 0x6b7667617465)), relSem: make(chan struct{}, maxReleaseCalls)}
	if s.tok == nil {
		t, err := tokenizer.Load(o.TokenizerDir)
		if err != nil {
			return nil, fmt.Errorf("load tokenizer (--tokenizer): %w", err)
		}
		s.tok = t
	}
	s.enc = tokenizer.NewPrefixCache(s.tok, o.TokenizerCacheBytes)
	preset, ok := engine.LookupPreset(o.Preset)
	if !ok {
		return nil, fmt.Errorf("unknown --preset %q", o.Preset)
	}
	maxLoRAs := o.MaxLoRAs
	if maxLoRAs == 0 && len(o.LoRAModules) > 0 {
		maxLoRAs = 1
	}
	s.models = newModelTable(o.servedNames(), o.LoRAModules)

	if s.ln, err = net.Listen("tcp", net.JoinHostPort(o.Host, strconv.Itoa(o.Port))); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.host, s.port = advertised(s.ln.Addr(), o.Host)
	if o.AdvertiseHost != "" {
		s.host = o.AdvertiseHost
	}
	s.engID = fmt.Sprintf("kvgate-sim-%s-%d", s.host, s.port)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	fail := func(err error) (*Server, error) {
		s.cancel()
		_ = s.ln.Close()
		if s.pub != nil {
			_ = s.pub.Close()
		}
		if s.kvc != nil {
			s.kvc.close()
		}
		return nil, err
	}

	var sink engine.EventSink
	if o.KVEventsEndpoint != "" {
		s.topic = o.KVEventsTopic
		if s.topic == "" {
			s.topic = kvwire.BuildTopic(net.JoinHostPort(s.host, strconv.Itoa(s.port)), s.models.base[0])
		}
		s.pub, err = kvwire.NewPublisher(s.ctx, kvwire.PublisherConfig{
			Endpoint: o.KVEventsEndpoint, ReplayEndpoint: o.KVEventsReplayEndpoint,
			Topic: s.topic, Encoding: o.KVEventsEncoding, Logger: o.Logger,
		})
		if err != nil {
			return fail(err)
		}
		sink = newEventSink(s.pub, s.models.loraIDs, s.log)
	}
	kvb := o.KVBytesPerToken
	if kvb == 0 {
		kvb = preset.Timing.Model.KVBytesPerToken()
	}
	if o.Agent != "" {
		if s.dp, err = newDataPlane(s, kvb); err != nil {
			return fail(err)
		}
		sink = &tee{next: sink, d: s.dp}
	}
	if kvc != nil && kvc.Connector != ConnectorNixl {
		if s.kvc, err = newKVConnector(s, kvc, kvb); err != nil {
			return fail(err)
		}
	}
	cfg := engine.Config{
		Timing: preset.Timing, Events: sink, BlockSize: o.BlockSize, NumGPUBlocks: o.NumGPUBlocks,
		MaxNumSeqs: o.MaxNumSeqs, MaxNumBatchedTokens: o.MaxNumBatchedTokens, MaxModelLen: o.MaxModelLen,
		MaxLoRAs: maxLoRAs, MaxWaiting: o.MaxWaiting, HashSeed: o.HashSeed, HeldBlockTimeout: o.HeldBlockTimeout,
		SchedulingPolicy: engine.SchedulingPolicy(o.SchedulingPolicy),
	}
	if s.dp != nil {
		// The pull is real and timed by the clock; the engine models only
		// its default 1 ms for taking the landed blocks in.
		cfg.KVTransferBandwidth, cfg.KVTransferLatency = 1e15, time.Millisecond
	}
	if s.runner, err = engine.NewRunner(cfg, o.TimeScale); err != nil {
		return fail(err)
	}
	s.engCfg = s.runner.Config()

	s.reg = prometheus.NewRegistry()
	if s.metrics, err = newServerMetrics(s.reg, s.models.base[0], s.runner, s.engCfg); err != nil {
		return fail(err)
	}
	if s.peers, err = newPeerGuard(v.allow, s.log, s.reg); err != nil {
		return fail(err)
	}
	s.hidden = preset.Timing.Model.Hidden
	if ids := s.tok.Encode("<|image_pad|>"); len(ids) == 1 {
		s.padToken = ids[0]
	}
	if err := s.registerEncoderMetrics(); err != nil {
		return fail(err)
	}
	if s.kvc != nil {
		if err := s.kvc.registerMetrics(s.reg); err != nil {
			return fail(err)
		}
	}
	if s.dp != nil {
		if err := s.dp.start(s.ctx, s.engCfg.NumGPUBlocks); err != nil {
			s.dp.conn.Close()
			return fail(err)
		}
	}
	s.client = newPeerClient(releaseTimeout)
	s.http = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return s.ctx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	return s, nil
}

// advertised is the host and port peers should use: the listener's, with
// an unspecified bind address replaced by loopback, the address a local
// fleet reaches it on.
func advertised(addr net.Addr, host string) (string, int) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return host, 0
	}
	if ta.IP == nil || ta.IP.IsUnspecified() {
		return "127.0.0.1", ta.Port
	}
	return ta.IP.String(), ta.Port
}

// Addr is the bound HTTP address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// URL is the base URL of the HTTP API as peers reach it.
func (s *Server) URL() string {
	return "http://" + net.JoinHostPort(s.host, strconv.Itoa(s.port))
}

// KVEventsAddr is the bound address of the KV-events PUB socket, "" when
// events are off or the socket connects out.
func (s *Server) KVEventsAddr() string {
	if s.pub == nil || s.pub.Addr() == nil {
		return ""
	}
	return s.pub.Addr().String()
}

// KVEventsReplayAddr is the bound address of the replay socket, or "".
func (s *Server) KVEventsReplayAddr() string {
	if s.pub == nil || s.pub.ReplayAddr() == nil {
		return ""
	}
	return s.pub.ReplayAddr().String()
}

// Topic is the KV-events topic, "" when events are off.
func (s *Server) Topic() string { return s.topic }

// Registry is the server's private metrics registry.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Engine is the engine runner, for in-process callers that inspect it.
func (s *Server) Engine() *engine.Runner { return s.runner }

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", s.generate(apiCompletions))
	mux.HandleFunc("/v1/chat/completions", s.generate(apiChat))
	mux.HandleFunc("/v1/models", s.method(http.MethodGet, s.listModels))
	mux.HandleFunc("/health", s.method(http.MethodGet, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/reset_prefix_cache", s.method(http.MethodPost, s.resetPrefixCache))
	mux.HandleFunc("/kvgate/release_kv", s.method(http.MethodPost, s.releaseKV))
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	return mux
}

// method answers other methods as FastAPI does.
func (s *Server) method(m string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != m {
			w.Header().Set("Allow", m)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
			return
		}
		h(w, r)
	}
}

// Run steps the engine and serves HTTP until ctx ends, then shuts down
// and closes the server.
func (s *Server) Run(ctx context.Context) error {
	engineDone := make(chan error, 1)
	go func() { engineDone <- s.runner.Run(s.ctx) }()
	serveDone := make(chan error, 2)
	go func() { serveDone <- s.http.Serve(s.ln) }()
	if s.kvc != nil && s.kvc.srv != nil {
		go func() { serveDone <- s.kvc.run() }()
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveDone:
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
	}
	shut, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	_ = s.http.Shutdown(shut)
	return errors.Join(err, s.Close(), <-engineDone)
}

// Close stops everything at once: handlers see their contexts end, the
// engine stops and the KV-events publisher closes. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		err := s.http.Close()
		if errors.Is(err, net.ErrClosed) {
			// Shutdown already closed that connection: nothing was lost.
			err = nil
		}
		_ = s.ln.Close() // Serve may never have taken it over
		s.relMu.Lock()
		s.relClosed = true
		s.relMu.Unlock()
		s.relWG.Wait()
		if s.pub != nil {
			err = errors.Join(err, s.pub.Close())
		}
		if s.dp != nil {
			s.dp.close()
		}
		if s.kvc != nil {
			s.kvc.close()
		}
		s.closeErr = err
	})
	return s.closeErr
}

// newID returns a vLLM-style request id; ids come from the seeded
// generator so a run's generated tokens repeat with its --seed.
func (s *Server) newID(prefix string) string {
	s.rngMu.Lock()
	a, b := s.rng.Uint64(), s.rng.Uint64()
	s.rngMu.Unlock()
	return fmt.Sprintf("%s-%016x%016x", prefix, a, b)
}

// injectFailure draws whether this request fails (--failure-rate).
func (s *Server) injectFailure() bool {
	if s.opts.FailureRate == 0 {
		return false
	}
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64() < s.opts.FailureRate
}
