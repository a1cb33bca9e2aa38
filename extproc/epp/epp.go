package epp

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/director"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/k8s"
	"github.com/kvgate/kvgate/extproc/endpoints/poolmetrics"
	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/extproc/epp/leader"
	"github.com/kvgate/kvgate/extproc/epp/metricsauth"
	"github.com/kvgate/kvgate/extproc/epp/tracing"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/kvevents"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/metrics"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/plugins/disagg"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/plugins/transfercost"
	"github.com/kvgate/kvgate/extproc/prefixmatch"
	"github.com/kvgate/kvgate/extproc/saturation"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/extproc/telemetry"
	"github.com/kvgate/kvgate/internal/bytebudget"
	"github.com/kvgate/kvgate/internal/cliflag"
	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/memlimit"
)

// gRPC health service names. HealthLiveness and HealthReadiness are
// llm-d's; HealthInferenceExtension is what the GIE chart's probes ask
// for. Readiness (and the overall "" service, the ext_proc service and
// GIE's name) turns SERVING once discovery delivered the first endpoint
// set and NOT_SERVING when draining starts; liveness is SERVING from the
// start to the end.
const (
	HealthLiveness           = "liveness"
	HealthReadiness          = "readiness"
	HealthInferenceExtension = "inference-extension"
)

var readinessServices = []string{"", HealthReadiness, HealthInferenceExtension, "envoy.service.ext_proc.v3.ExternalProcessor"}

// maxConcurrentStreams bounds in-flight ext_proc streams per connection.
const maxConcurrentStreams = 10_000

// Options are the picker's settings, one per flag.
type Options struct {
	ConfigFile    string
	ConfigText    string
	EndpointsFile string
	// ObjectivesFile holds InferenceObjectives (YAML) for a picker without
	// Kubernetes discovery; empty for none.
	ObjectivesFile         string
	GRPCAddr               string
	HealthAddr             string
	MetricsAddr            string
	RefreshMetricsInterval time.Duration
	PoolName               string
	// Kubernetes discovery, used when EndpointsFile is empty: the
	// InferencePool PoolName in PoolNamespace, or without a pool the pods
	// matching EndpointSelector on EndpointTargetPorts.
	PoolNamespace       string
	EndpointSelector    string
	EndpointTargetPorts []int
	Kubeconfig          string
	// KVEventsAddr is the ZMQ endpoint the picker binds for the model
	// servers' KV-cache events (e.g. tcp://*:5557); empty for none.
	KVEventsAddr string
	// KVEvents are the intake's limits (kvflags.go).
	KVEvents KVEventLimits
	// Telemetry subscribes to the node agents (telemetry.go).
	Telemetry          TelemetryOptions
	TrustFilterHeaders bool
	// EnginePriority writes each request's InferenceObjective priority,
	// negated, into chat and completions bodies as vLLM's "priority"
	// (director.Options.EnginePriority).
	EnginePriority      bool
	MaxRequestBodyBytes int
	// Budgets (see server.Options and endpoints.Config).
	MaxRequestHeaders      int
	MaxRequestHeaderBytes  int
	RequestBodyBudgetBytes int64
	// MemoryLimit is the Go soft memory limit Main applies (memlimit.Auto:
	// the body and KV-event budgets plus memlimit.Headroom; 0: none);
	// GOMEMLIMIT wins.
	MemoryLimit         int64
	RequestIdleTimeout  time.Duration
	ResponseIdleTimeout time.Duration
	MaxEndpoints        int
	// DrainTimeout bounds the wait for in-flight streams at shutdown: an
	// LLM response can stream for minutes, but a Kubernetes pod is killed
	// 30 s after SIGTERM by default.
	DrainTimeout time.Duration
	LogLevel     slog.Level
	// LogFormat is "console" (text) or "json" (--zap-encoder, as the
	// upstream charts pass it).
	LogFormat string

	// The upstream pickers' serving flags (flags.go).

	// PoolGroup is the InferencePool's API group; kvgate serves
	// inference.networking.k8s.io (v1) pools only.
	PoolGroup string
	// LeaderElection: replicas compete for a Lease; only the leader
	// reports ready (--ha-enable-leader-election).
	LeaderElection bool
	// SecureServing puts TLS on the ext_proc port; unset means on with
	// Kubernetes discovery (the upstream default, which gateways dial with
	// TLS) and off with --endpoints (a local run).
	SecureServing Toggle
	CertPath      string
	CertReload    bool
	TLSMinVersion string
	// TLSCipherSuites is a comma-separated list of Go cipher-suite names.
	TLSCipherSuites string
	// MetricsAuth guards /metrics with TokenReview and
	// SubjectAccessReview; unset means on with Kubernetes discovery, off
	// with --endpoints.
	MetricsAuth Toggle
	// Tracing exports OpenTelemetry spans over OTLP, configured by the
	// OTEL_* environment.
	Tracing bool
	// ModelServerMetrics are the upstream metric-name flags; each must
	// name a metric kvgate's scraper reads.
	ModelServerMetrics MetricNames
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		GRPCAddr:               ":9002",
		HealthAddr:             ":9003",
		MetricsAddr:            ":9090",
		RefreshMetricsInterval: scrape.DefaultInterval,
		PoolName:               "kvgate",
		MaxRequestBodyBytes:    server.DefaultMaxBodyBytes,
		MaxRequestHeaders:      server.DefaultMaxHeaders,
		MaxRequestHeaderBytes:  server.DefaultMaxHeaderBytes,
		RequestBodyBudgetBytes: server.DefaultBodyBudgetBytes,
		MemoryLimit:            memlimit.Auto,
		RequestIdleTimeout:     server.DefaultRequestIdleTimeout,
		ResponseIdleTimeout:    server.DefaultResponseIdleTimeout,
		MaxEndpoints:           endpoints.DefaultMaxEndpoints,
		KVEvents:               defaultKVEventLimits(),
		Telemetry:              defaultTelemetryOptions(),
		DrainTimeout:           25 * time.Second,
		LogFormat:              "console",
		PoolGroup:              poolGroup,
		ModelServerMetrics:     defaultMetricNames(),
	}
}

// flagSet binds a flag set to o's fields; ParseFlags and Args share it, so
// that a parent's command line for a picker uses the picker's own flags.
func (o *Options) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvgate epp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "EndpointPickerConfig YAML file (default: GIE's default profile)")
	fs.StringVar(&o.ConfigFile, "config-file", o.ConfigFile, "alias of --config, as the GIE picker names it")
	fs.StringVar(&o.ConfigText, "config-text", o.ConfigText, "EndpointPickerConfig YAML given inline")
	fs.StringVar(&o.EndpointsFile, "endpoints", o.EndpointsFile, "static endpoints YAML file, watched for changes")
	fs.StringVar(&o.ObjectivesFile, "objectives", o.ObjectivesFile, "with --endpoints: InferenceObjective YAML documents (those whose poolRef is --pool-name) giving request priorities, read at start")
	fs.StringVar(&o.GRPCAddr, "grpc-addr", o.GRPCAddr, "ext_proc gRPC listen address")
	fs.StringVar(&o.HealthAddr, "health-addr", o.HealthAddr, "gRPC health service listen address")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "Prometheus /metrics listen address")
	fs.DurationVar(&o.RefreshMetricsInterval, "refresh-metrics-interval", o.RefreshMetricsInterval, "interval between scrapes of each model server's /metrics")
	fs.StringVar(&o.PoolName, "pool-name", o.PoolName, "InferencePool to watch (without --endpoints); also the name label of pool metrics")
	fs.StringVar(&o.PoolNamespace, "pool-namespace", o.PoolNamespace, "namespace of the InferencePool (default: the kubeconfig context's, or the pod's own)")
	fs.StringVar(&o.EndpointSelector, "endpoint-selector", o.EndpointSelector, "without an InferencePool: label selector of the model-server pods")
	fs.Var(ports{&o.EndpointTargetPorts}, "endpoint-target-ports", "with --endpoint-selector: comma-separated ports of the model servers")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
	fs.StringVar(&o.KVEventsAddr, "kv-events-addr", o.KVEventsAddr, "ZMQ endpoint to bind for vLLM KV-cache events, e.g. tcp://*:5557 (servers publish with topic kv@<ip:port>@<model>)")
	fs.BoolVar(&o.TrustFilterHeaders, "trust-filter-headers", o.TrustFilterHeaders, "route requests without a body on the x-kvgate-* headers of kvgate's wasm filter (Envoy request body mode NONE); only behind a proxy that runs the filter")
	fs.BoolVar(&o.EnginePriority, "engine-priority", o.EnginePriority, "write each request's InferenceObjective priority, negated (vLLM: lower is scheduled first), into chat and completions bodies as \"priority\"; only for model servers run with --scheduling-policy priority (vLLM refuses a non-zero priority under fcfs)")
	fs.IntVar(&o.MaxRequestBodyBytes, "max-request-body-bytes", o.MaxRequestBodyBytes, "largest request body the picker buffers")
	fs.IntVar(&o.MaxRequestHeaders, "max-request-headers", o.MaxRequestHeaders, "most headers in one ext_proc header message before 431")
	fs.IntVar(&o.MaxRequestHeaderBytes, "max-request-header-bytes", o.MaxRequestHeaderBytes, "most header bytes (names plus values) in one ext_proc header message before 431")
	fs.Int64Var(&o.RequestBodyBudgetBytes, "request-body-budget-bytes", o.RequestBodyBudgetBytes, "request body bytes all streams together may buffer; beyond it new bodies get 503 (<0: unlimited)")
	fs.Var(memlimit.Value{N: &o.MemoryLimit}, "memory-limit", "Go soft memory limit (bytes, or with KiB/MiB/GiB): auto = --request-body-budget-bytes + --kv-events-memory-budget-bytes + 256 MiB (none if the body budget is unlimited), 0 = none; GOMEMLIMIT in the environment wins")
	fs.DurationVar(&o.RequestIdleTimeout, "request-idle-timeout", o.RequestIdleTimeout, "longest silence of a stream while its request arrives (<0: none)")
	fs.DurationVar(&o.ResponseIdleTimeout, "response-idle-timeout", o.ResponseIdleTimeout, "longest silence of a routed stream before it is ended and its in-flight charge released (<0: none)")
	fs.IntVar(&o.MaxEndpoints, "max-endpoints", o.MaxEndpoints, "most endpoints in the pool; a larger set is refused and the previous one kept")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "at shutdown, how long in-flight requests may finish before their streams are cut")
	fs.TextVar(&o.LogLevel, "log-level", o.LogLevel, "log level: debug, info, warn, error")
	o.upstreamFlags(fs)
	o.KVEvents.flags(fs)
	o.Telemetry.flags(fs)
	return fs
}

// ports is --endpoint-target-ports: each use adds its comma-separated
// ports.
type ports struct{ vals *[]int }

func (p ports) String() string {
	if p.vals == nil {
		return ""
	}
	s := make([]string, len(*p.vals))
	for i, v := range *p.vals {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (p ports) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		port, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("port %q: %w", f, err)
		}
		*p.vals = append(*p.vals, port)
	}
	return nil
}

// Args is the command line (after `kvgate epp`) that parses back to o:
// the flags whose values differ from the defaults.
func (o Options) Args() []string {
	def := DefaultOptions()
	return cliflag.Args(o.flagSet(io.Discard), def.flagSet(io.Discard), aliasFlags...)
}

// ParseFlags parses `kvgate epp` arguments.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := o.flagSet(stderr)
	if err := cliflag.Parse(fs, joinBoolValues(fs, args)); err != nil {
		return o, err
	}
	if o.ConfigFile != "" && o.ConfigText != "" {
		return o, errors.New("--config and --config-text are exclusive")
	}
	if o.EndpointsFile != "" && (o.EndpointSelector != "" || len(o.EndpointTargetPorts) > 0) {
		return o, errors.New("--endpoints and --endpoint-selector are exclusive: endpoints come from the file or from Kubernetes")
	}
	if err := o.Telemetry.check(); err != nil {
		return o, err
	}
	if o.ObjectivesFile != "" && o.EndpointsFile == "" {
		return o, errors.New("--objectives needs --endpoints: with Kubernetes discovery the InferenceObjectives come from the cluster")
	}
	if o.MaxRequestHeaders <= 0 || o.MaxRequestHeaderBytes <= 0 || o.MaxEndpoints <= 0 {
		return o, errors.New("--max-request-headers, --max-request-header-bytes and --max-endpoints must be positive")
	}
	if o.RequestBodyBudgetBytes == 0 {
		return o, errors.New("--request-body-budget-bytes 0 would refuse every body; use a negative value for no limit")
	}
	if o.RefreshMetricsInterval <= 0 {
		return o, fmt.Errorf("--refresh-metrics-interval must be positive, got %v", o.RefreshMetricsInterval)
	}
	if err := o.validateUpstream(); err != nil {
		return o, err
	}
	if err := o.KVEvents.config(&kvevents.Config{}); err != nil {
		return o, err
	}
	return o, nil
}

// Main runs `kvgate epp` with command-line args until ctx ends. The picker
// logs to stderr and writes nothing to stdout.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	o, err := ParseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := newLogger(stderr, o)
	limit, src := o.ApplyMemoryLimit(os.Getenv)
	log.Info("memory limit", "bytes", limit, "from", src)
	p, err := New(o, log)
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Run(ctx)
}

// ApplyMemoryLimit sets the process's Go memory limit from --memory-limit
// (see internal/memlimit) and returns the limit in force and where it came
// from. It is process-wide, so Main calls it, not New. Auto counts both
// budgets the picker buffers against: request bodies and KV events read
// but not yet applied.
func (o Options) ApplyMemoryLimit(getenv func(string) string) (int64, memlimit.Source) {
	budget := o.RequestBodyBudgetBytes
	if budget >= 0 {
		budget += o.KVEvents.MemoryBudgetBytes
	}
	return memlimit.Apply(memlimit.Resolve(o.MemoryLimit, budget), getenv)
}

// Picker is an assembled Endpoint Picker. New builds it without starting
// anything; Run binds its sockets and serves; Close releases what New
// acquired.
type Picker struct {
	opts       Options
	log        *slog.Logger
	reg        *prometheus.Registry
	metrics    *metrics.Metrics
	ds         *endpoints.Datastore
	source     endpoints.Source
	objectives director.Objectives
	rewrites   director.ModelRewrites
	scraper    *scrape.Scraper
	built      *config.Built
	server     *server.Server
	// gate is the flow-control layer; nil without the flowControl gate.
	gate *flowcontrol.Gate
	// kvIndex holds what the servers' KV-cache events say they cache;
	// kvEvents feeds it while Run runs.
	kvIndex  *kvindex.Index
	kvEvents *kvevents.Subscriber
	// telemetry holds the node agents' reports (nil without
	// --telemetry-agents or --telemetry-agent-selector); agents finds the
	// agents in Kubernetes (nil without a selector).
	telemetry *telemetry.Store
	agents    *k8s.Discovery
	// kvCfg holds the intake's limits and TLS from the flags.
	kvCfg kvevents.Config
	// listening is closed once Run has bound every socket: from then on
	// Addrs and KVEventsAddr are valid.
	listening chan struct{}
	listeners struct{ grpc, health, metrics net.Listener }
	// Serving settings resolved from the flags (serving.go): TLS of the
	// ext_proc port (nil: plaintext), the Lease elector (nil without
	// --ha-enable-leader-election), the /metrics guard (nil: open), the
	// tracer (nil without --tracing).
	tls     *tls.Config
	ready   *readiness
	elector *leader.Elector
	guard   *metricsauth.Guard
	tracer  *tracing.Tracer
}

// New builds a picker: configuration, plugins, metrics and discovery. It
// starts no goroutine and binds nothing, so an error leaves nothing to
// undo.
func New(o Options, log *slog.Logger) (*Picker, error) {
	cfg, err := loadConfig(o)
	if err != nil {
		return nil, err
	}
	p := &Picker{opts: o, log: log, reg: prometheus.NewRegistry(), ds: endpoints.NewDatastoreWith(endpoints.Config{
		MaxEndpoints: o.MaxEndpoints, AwaitFirstScrape: true,
	}), listening: make(chan struct{})}
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := p.reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	// metrics.New registers with MustRegister; a duplicate must come back
	// as New's error, not as a panic in the caller.
	reg := &checkedRegisterer{Registerer: p.reg}
	p.metrics = metrics.New(reg)
	if reg.err != nil {
		return nil, fmt.Errorf("metrics: %w", reg.err)
	}

	p.kvIndex = kvindex.New(kvindex.Config{})
	if err := p.reg.Register(kvindex.NewCollector(p.kvIndex)); err != nil {
		return nil, fmt.Errorf("kv index metrics: %w", err)
	}
	h := &scheduling.Handle{Log: log, Now: time.Now, Services: precise.WithKVIndex(nil, p.kvIndex)}
	h.Services[prefixmatch.ServiceRecorder] = p.metrics
	h.Services[disagg.ServiceRecorder] = p.metrics
	h.Services[flowpolicy.ServiceRegisterer] = prometheus.Registerer(p.reg)
	latency.WithRecorder(h.Services, p.metrics)
	if p.telemetry, p.agents, err = telemetryStore(o, log); err != nil {
		return nil, err
	}
	if p.telemetry != nil {
		h.Services[telemetry.ServiceKey] = p.telemetry
		// The P/D transfer-cost decider prices transfers on the measured
		// node-pair network.
		h.Services[transfercost.ServiceNetworkView] = transfercost.NetworkView(p.telemetry)
		if err := p.reg.Register(p.telemetry); err != nil {
			return nil, fmt.Errorf("telemetry metrics: %w", err)
		}
	}
	if p.built, err = config.Build(cfg, all.Registry(), h, p.metrics.PluginDuration); err != nil {
		return nil, err
	}
	p.ds.Subscribe(endpoints.ListenerFunc(p.endpointsChanged))
	if err := poolmetrics.Register(p.reg, o.PoolName, p.ds); err != nil {
		return nil, fmt.Errorf("pool metrics: %w", err)
	}
	// The seconds-valued prefill backlog needs the learned speeds: only a
	// configuration with a latency model (predicted-latency-producer) has it.
	for _, pl := range p.built.Plugins {
		if lm, ok := pl.(interface{ Model() *latency.Model }); ok {
			if err := p.reg.Register(metrics.NewPrefillBacklog(o.PoolName, p.ds, lm.Model())); err != nil {
				return nil, fmt.Errorf("prefill backlog metrics: %w", err)
			}
			break
		}
	}
	p.scraper = scrape.New(p.ds, p.built.Metrics.Scrape(scrape.Config{Pool: o.PoolName, Interval: o.RefreshMetricsInterval, Logger: log}))
	if err := p.reg.Register(p.scraper); err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	switch {
	case p.built.Discovery != nil && o.EndpointsFile != "":
		return nil, errors.New("--endpoints and the configuration's dataLayer.discovery both name the endpoints: give one")
	case p.built.Discovery != nil:
		// llm-d's file-discovery: no Kubernetes.
		p.source = p.built.Discovery
	case o.EndpointsFile != "":
		p.source = &staticfile.File{Path: o.EndpointsFile, Logger: log}
	}
	if p.source != nil {
		if o.ObjectivesFile != "" {
			objs, err := loadObjectives(o.ObjectivesFile, o.PoolName)
			if err != nil {
				return nil, err
			}
			p.objectives = objs
		}
	} else {
		disc, err := kubernetesSource(o, log)
		if err != nil {
			return nil, err
		}
		p.source, p.objectives, p.rewrites = disc, disc, disc
	}

	dopts := director.Options{
		Pool:             p.ds,
		Scheduler:        p.built.Scheduler,
		Hooks:            director.Hooks{RequestHeader: p.built.RequestHeader, ResponseHeader: p.built.ResponseHeader, ResponseMetadata: p.built.ResponseMetadata, PreRequest: p.built.PreRequest, FirstToken: p.built.FirstToken, ResponseComplete: p.built.ResponseComplete, Hold: p.built.Hold},
		Saturation:       saturation.New(p.built.Saturation, time.Now),
		TrustFilterHints: o.TrustFilterHeaders,
		EnginePriority:   o.EnginePriority,
		Objectives:       p.objectives,
		Rewrites:         p.rewrites,
		Metrics:          p.metrics,
		Logger:           log,
	}
	if sd, ok := p.built.Detector.(director.Saturation); ok {
		dopts.Saturation = sd
	}
	if err := p.flowControl(&dopts); err != nil {
		return nil, err
	}
	d := director.New(dopts)
	p.server = server.New(d, server.Options{
		MaxRequestBodyBytes: o.MaxRequestBodyBytes, Logger: log, Parser: p.built.Parsers,
		MaxHeaders: o.MaxRequestHeaders, MaxHeaderBytes: o.MaxRequestHeaderBytes,
		BodyBudget:          bytebudget.New(o.RequestBodyBudgetBytes),
		RequestIdleTimeout:  zeroIsNone(o.RequestIdleTimeout),
		ResponseIdleTimeout: zeroIsNone(o.ResponseIdleTimeout),
	})
	if err := p.serving(); err != nil {
		return nil, err
	}
	if err := o.KVEvents.config(&p.kvCfg); err != nil {
		return nil, err
	}
	if p.kvCfg.TLS, err = o.KVEvents.tls(); err != nil {
		return nil, err
	}
	return p, nil
}

// zeroIsNone maps a flag's 0 ("none") to the options' "none" (negative):
// there, zero takes the default.
func zeroIsNone(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// flowControl builds the flow-control layer when the configuration turns it
// on, and says when a flowControl section is ignored for want of the gate.
func (p *Picker) flowControl(dopts *director.Options) error {
	if p.built.FlowControlIgnored {
		p.log.Warn("flowControl section ignored: the flowControl feature gate is off (add featureGates: [flowControl])")
	}
	fc := p.built.FlowControl
	if fc == nil {
		return nil
	}
	rec, err := flowcontrol.NewMetrics(p.reg, p.opts.PoolName)
	if err != nil {
		return fmt.Errorf("flow-control metrics: %w", err)
	}
	if p.gate, err = flowcontrol.NewGate(fc.Config, flowcontrol.Options{Pool: p.ds, Recorder: rec}, time.Now); err != nil {
		return fmt.Errorf("flowControl: %w", err)
	}
	// A new endpoint may take queued requests at once.
	p.ds.Subscribe(endpoints.ListenerFunc(func(endpoints.Change) { p.gate.Notify() }))
	dopts.Admission = p.gate
	cfg := fc.Config
	p.log.Info("Flow Control enabled", "detector", cfg.DetectorName, "bands", len(cfg.Bands), "maxRequests", cfg.MaxRequests, "maxBytes", cfg.MaxBytes,
		"defaultRequestTTL", cfg.RequestTTL, "noEndpointRequestTTL", cfg.NoEndpointTTL, "enableEviction", cfg.EnableEviction)
	return nil
}

// checkedRegisterer keeps the first registration error of MustRegister
// instead of panicking.
type checkedRegisterer struct {
	prometheus.Registerer
	err error
}

func (r *checkedRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil && r.err == nil {
			r.err = err
		}
	}
}

// Close releases what New acquired. New holds no goroutine, socket or
// file, so there is nothing to release today; callers defer it anyway so
// that a component gaining such a resource needs no caller changed.
func (p *Picker) Close() error { return nil }

// kubernetesSource discovers endpoints from an InferencePool, or from the
// pods an --endpoint-selector matches, and resolves InferenceObjective
// priorities.
func kubernetesSource(o Options, log *slog.Logger) (*k8s.Discovery, error) {
	k8s.RouteLogs(log)
	ko := k8s.Options{PoolNamespace: o.PoolNamespace, Kubeconfig: o.Kubeconfig, Logger: log}
	if o.EndpointSelector != "" {
		ko.EndpointSelector, ko.TargetPorts = o.EndpointSelector, o.EndpointTargetPorts
	} else {
		ko.PoolName = o.PoolName
	}
	d, err := k8s.New(ko)
	if err != nil {
		return nil, fmt.Errorf("kubernetes discovery (or give --endpoints FILE): %w", err)
	}
	return d, nil
}

func loadConfig(o Options) (*config.Config, error) {
	if o.ConfigText != "" {
		return config.Parse([]byte(o.ConfigText))
	}
	return config.Load(o.ConfigFile)
}

// Listening is closed once Run has bound the picker's sockets; Addrs and
// KVEventsAddr are valid from then on.
func (p *Picker) Listening() <-chan struct{} { return p.listening }

// Addrs are the bound listener addresses: ext_proc, health, metrics. Valid
// once Listening is closed.
func (p *Picker) Addrs() (grpcAddr, healthAddr, metricsAddr string) {
	return p.listeners.grpc.Addr().String(), p.listeners.health.Addr().String(), p.listeners.metrics.Addr().String()
}

// Datastore exposes the endpoint datastore (for tests and embedding).
func (p *Picker) Datastore() *endpoints.Datastore { return p.ds }

// KVEventsAddr is the bound KV-event socket address; nil without one.
// Valid once Listening is closed.
func (p *Picker) KVEventsAddr() net.Addr { return p.kvEvents.Addr() }

// kvEventsConfig is the intake's configuration: the flags' limits (checked
// by New) on the socket bind.
func (p *Picker) kvEventsConfig(bind string) kvevents.Config {
	cfg := p.kvCfg
	cfg.Bind, cfg.Registerer, cfg.Logger = bind, p.reg, p.log
	return cfg
}

// bind starts the KV-event subscriber (it binds its socket) and binds the
// three listeners. On error it undoes exactly the steps already taken.
func (p *Picker) bind() (err error) {
	bind := p.opts.KVEventsAddr
	if bind == "" {
		bind = p.built.KVEvents.Bind // llm-d's kvEventsConfig.zmqEndpoint
	}
	if p.kvEvents, err = kvevents.New(context.Background(), p.kvIndex, p.kvEventsConfig(bind)); err != nil {
		return fmt.Errorf("--kv-events-addr: %w", err)
	}
	var bound []net.Listener
	defer func() {
		if err != nil {
			for _, ln := range bound {
				_ = ln.Close()
			}
			_ = p.kvEvents.Close()
		}
	}()
	for _, l := range []struct {
		addr string
		dst  *net.Listener
	}{{p.opts.GRPCAddr, &p.listeners.grpc}, {p.opts.HealthAddr, &p.listeners.health}, {p.opts.MetricsAddr, &p.listeners.metrics}} {
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", l.addr, err)
		}
		bound = append(bound, ln)
		*l.dst = ln
	}
	return nil
}

// endpointsChanged follows membership: a new endpoint's KV events are
// subscribed to; an endpoint that left loses its KV-index entries and the
// plugins' per-endpoint state.
func (p *Picker) endpointsChanged(c endpoints.Change) {
	gone := make([]string, 0, len(c.Removed))
	for _, e := range c.Removed {
		if p.ds.ByAddress(e.Address()) == nil { // a changed spec re-adds the address
			p.kvEvents.EndpointRemoved(e.Address())
			gone = append(gone, e.Address())
		}
	}
	for _, e := range c.Added {
		p.kvEvents.AddEndpoint(e.Address(), p.kvEventSource(e))
	}
	if len(gone) > 0 {
		for _, h := range p.built.EndpointsRemoved {
			h.EndpointsRemoved(gone)
		}
	}
}

// kvEventSource is where e's KV events come from: its own configuration
// (endpoints file, pod annotations), else the ports of llm-d's pod
// discovery (kvEventsConfig.podDiscoveryConfig) on its IP. An endpoint of
// one data-parallel rank of a server (Spec.DataParallel: discovery's
// <pod>-rank-<i>) is placed among the server's ranks, and discovery's
// ports are offset by its rank:
// vLLM runs a publisher per rank, on the configured port plus the rank,
// and its replay socket likewise (ZmqEventPublisher.offset_endpoint_port).
// vLLM's rank is global across nodes and i is the port's place in the pod,
// so a pod whose ranks start at S must configure its ports less S (llm-d's
// wide-EP contract); the subscriber learns S from the batches' tags.
func (p *Picker) kvEventSource(e *endpoints.Endpoint) kvevents.Source {
	spec := e.Spec()
	src := kvevents.Source{Events: spec.KVEvents, Replay: spec.KVEventsReplay}
	if dp := spec.DataParallel; dp != nil {
		src.Server, src.Rank = dp.Server, dp.Rank
	}
	ev := p.built.KVEvents
	if src.Events != "" || ev.SocketPort <= 0 {
		return src
	}
	host, _, err := net.SplitHostPort(e.Address())
	if err != nil {
		return src
	}
	events, err := kvwire.OffsetPort("tcp://"+net.JoinHostPort(host, strconv.Itoa(ev.SocketPort)), src.Rank)
	replay := ""
	if err == nil && ev.ReplayPort > 0 {
		replay, err = kvwire.OffsetPort("tcp://"+net.JoinHostPort(host, strconv.Itoa(ev.ReplayPort)), src.Rank)
	}
	if err != nil {
		// No server binds such a port: nothing to subscribe to.
		p.log.Warn("no KV-event socket for a data-parallel rank", "endpoint", e.Name(), "err", err)
		return src
	}
	src.Events, src.Replay = events, replay
	return src
}

// Run binds the picker's sockets and serves until ctx ends or a component
// fails, then shuts down gracefully. It returns the first error of any
// component, after everything it started has stopped. Run may be called
// once.
func (p *Picker) Run(ctx context.Context) error {
	if err := p.bind(); err != nil {
		return err
	}
	close(p.listening)
	g, ctx := errgroup.WithContext(ctx)

	// Each stream buffers at most one request body; bounding the streams
	// bounds the picker's memory under a flood.
	extproc := grpc.NewServer(p.extprocOptions()...)
	p.server.Register(extproc)
	healthSrv := health.NewServer()
	healthGRPC := grpc.NewServer()
	healthpb.RegisterHealthServer(healthGRPC, healthSrv)
	// The ext_proc service answers on the main port too, so that Envoy's
	// own gRPC health checks against :9002 work as with the GIE picker.
	healthpb.RegisterHealthServer(extproc, healthSrv)
	p.ready.attach(healthSrv)
	metricsSrv := &http.Server{Handler: p.metricsHandler(), ReadHeaderTimeout: 5 * time.Second}
	if p.elector != nil {
		g.Go(func() error { return p.elector.Run(ctx) })
	}

	// The dispatcher stops with ctx: at shutdown the queue is refused,
	// not dispatched (see Gate.Shutdown).
	if p.gate != nil {
		g.Go(func() error { return p.gate.Run(ctx) })
	}
	src := &firstApply{Source: p.source, done: make(chan struct{})}
	g.Go(func() error { return p.ds.Run(ctx, src) })
	g.Go(func() error { return p.scraper.Run(ctx) })
	for _, pl := range p.built.Pollers {
		g.Go(func() error { return pl.Poll(ctx, p.ds, p.opts.RefreshMetricsInterval) })
	}
	if p.telemetry != nil {
		g.Go(func() error { return runTelemetry(ctx, p.telemetry, p.agents) })
	}
	if every := p.built.KVIndexLogInterval; every > 0 {
		g.Go(func() error { p.kvIndex.LogMetrics(ctx, p.log, every); return nil })
	}
	g.Go(func() error { return serveGRPC(extproc, p.listeners.grpc) })
	g.Go(func() error { return serveGRPC(healthGRPC, p.listeners.health) })
	g.Go(func() error {
		if err := metricsSrv.Serve(p.listeners.metrics); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		// Ready once discovery has delivered its first set of endpoints
		// (possibly empty: an empty pool is known, not unknown).
		select {
		case <-ctx.Done():
			return nil
		case <-src.done:
		}
		// Endpoints are routable only once scraped; give the first
		// scrapes a moment so that a fresh picker does not answer its
		// first requests with 503. Servers not answering by then stay
		// out until they do.
		for wait := time.Now().Add(time.Second); len(p.ds.Candidates()) < len(p.ds.All()) && time.Now().Before(wait); {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
		p.ready.setSynced()
		p.log.Info("picker ready", "grpc", p.listeners.grpc.Addr().String(), "endpoints", len(p.ds.All()))
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		// NOT_SERVING first, so that the proxy stops sending new requests
		// while the streams in flight drain; health and metrics stay up
		// for the whole drain.
		// Liveness stays SERVING while draining, as in llm-d, so that
		// the kubelet does not restart a picker that is shutting down.
		for _, svc := range readinessServices {
			healthSrv.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
		}
		if p.gate != nil {
			// Queued requests are refused as shutting down (503) at
			// once, so that the whole drain is left to the requests in
			// flight.
			p.gate.Shutdown()
		}
		drain, cancel := context.WithTimeout(context.Background(), p.opts.DrainTimeout)
		defer cancel()
		stopGRPC(drain, extproc)
		stopGRPC(drain, healthGRPC)
		_ = metricsSrv.Shutdown(drain)
		_ = p.kvEvents.Close()
		if p.tracer != nil {
			_ = p.tracer.Shutdown(drain)
		}
		return nil
	})
	p.log.Info("picker starting", "tls", p.tls != nil, "leader-election", p.elector != nil, "metrics-auth", p.guard != nil, "tracing", p.tracer != nil, "grpc", p.listeners.grpc.Addr().String(), "health", p.listeners.health.Addr().String(), "metrics", p.listeners.metrics.Addr().String())
	return g.Wait()
}

func serveGRPC(s *grpc.Server, ln net.Listener) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// stopGRPC drains in-flight streams, forcing them closed when ctx ends:
// a streaming response may outlive any sensible grace period.
func stopGRPC(ctx context.Context, s *grpc.Server) {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.Stop()
	}
}

// firstApply tells when a source's first membership set was accepted.
type firstApply struct {
	endpoints.Source
	once sync.Once
	done chan struct{}
}

func (f *firstApply) Run(ctx context.Context, apply func([]endpoints.Spec) error) error {
	return f.Source.Run(ctx, func(specs []endpoints.Spec) error {
		err := apply(specs)
		if err == nil {
			f.once.Do(func() { close(f.done) })
		}
		return err
	})
}
