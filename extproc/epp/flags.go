package epp

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/extproc/epp/tlscert"
	"github.com/kvgate/kvgate/internal/vllm"
)

// The flags of the GIE and llm-d pickers that their Helm charts and guides
// pass, with the same meaning; kvgate's own long-standing flags are in
// flagSet. A flag kvgate does not know still fails the parse, naming it.

// poolGroup is the only InferencePool API group kvgate discovers.
const poolGroup = "inference.networking.k8s.io"

// aliasFlags write a field another flag also writes; Args leaves them out.
// The port flags are Func flags (their String is always empty), so they
// are never written either: the address flags carry their value.
var aliasFlags = []string{"config-file"}

// Toggle is a boolean flag whose default depends on the rest of the
// command line: unset until given.
type Toggle uint8

const (
	ToggleUnset Toggle = iota
	ToggleOn
	ToggleOff
)

// On resolves t, def being the value when t is unset.
func (t Toggle) On(def bool) bool {
	switch t {
	case ToggleOn:
		return true
	case ToggleOff:
		return false
	}
	return def
}

type toggleValue struct{ t *Toggle }

func (v toggleValue) IsBoolFlag() bool { return true }

func (v toggleValue) String() string {
	if v.t == nil {
		return ""
	}
	switch *v.t {
	case ToggleOn:
		return "true"
	case ToggleOff:
		return "false"
	}
	return ""
}

func (v toggleValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*v.t = ToggleOff
	if b {
		*v.t = ToggleOn
	}
	return nil
}

// MetricNames are the upstream model-server metric flags. kvgate's scraper
// recognizes vLLM's and SGLang's metrics by name on every page, so a flag
// naming one of those (the GIE chart passes SGLang's for
// modelServerType: sglang) is what the scraper does anyway; any other name
// (Triton, TensorRT-LLM) is refused, since kvgate would not read it.
type MetricNames struct {
	Queued, Running, KVCache, LoRA, CacheInfo string
}

func defaultMetricNames() MetricNames {
	return MetricNames{
		Queued:    vllm.MetricNumRequestsWaiting,
		Running:   vllm.MetricNumRequestsRunning,
		KVCache:   vllm.MetricKVCacheUsagePerc,
		LoRA:      vllm.MetricLoRARequestsInfo,
		CacheInfo: vllm.MetricCacheConfigInfo,
	}
}

// readable lists, per flag, the names the scraper reads.
func (m MetricNames) check() error {
	for _, c := range []struct {
		flag, value string
		ok          []string
	}{
		{"total-queued-requests-metric", m.Queued, []string{vllm.MetricNumRequestsWaiting, "sglang:num_queue_reqs"}},
		{"total-running-requests-metric", m.Running, []string{vllm.MetricNumRequestsRunning, "sglang:num_running_reqs"}},
		{"kv-cache-usage-percentage-metric", m.KVCache, []string{vllm.MetricKVCacheUsagePerc, vllm.MetricGPUCacheUsagePerc, "sglang:token_usage"}},
		// Empty turns LoRA scraping off upstream; kvgate reads the LoRA
		// gauge only where a server serves it.
		{"lora-info-metric", m.LoRA, []string{vllm.MetricLoRARequestsInfo, ""}},
		{"cache-info-metric", m.CacheInfo, []string{vllm.MetricCacheConfigInfo}},
	} {
		v := unquote(c.value)
		found := false
		for _, ok := range c.ok {
			found = found || v == ok
		}
		if !found {
			return fmt.Errorf("--%s=%q: kvgate's scraper does not read that metric (it reads %q)", c.flag, v, c.ok)
		}
	}
	return nil
}

// unquote drops the literal quotes the GIE chart renders around some
// metric names (`--kv-cache-usage-percentage-metric="sglang:token_usage"`
// is one argument, quotes included).
func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

// portFlag sets addr to ":port" (all interfaces), as the upstream pickers
// listen.
func portFlag(addr *string) func(string) error {
	return func(v string) error {
		port, err := strconv.Atoi(v)
		if err != nil || port < 0 || port > 65535 {
			return fmt.Errorf("port %q: want 0 to 65535", v)
		}
		*addr = net.JoinHostPort("", strconv.Itoa(port))
		return nil
	}
}

// verbosity maps logr/zap verbosity to slog: llm-d logs at V(4) for debug
// and V(5) for trace; kvgate's finest level is debug.
func verbosity(level *slog.Level) func(string) error {
	return func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("verbosity %q: want a number from 0", v)
		}
		*level = slog.LevelInfo
		if n >= 4 {
			*level = slog.LevelDebug
		}
		return nil
	}
}

// zapLevel takes zap's level names, or a verbosity number as --v.
func zapLevel(level *slog.Level) func(string) error {
	return func(v string) error {
		switch strings.ToLower(v) {
		case "debug":
			*level = slog.LevelDebug
		case "info":
			*level = slog.LevelInfo
		case "warn":
			*level = slog.LevelWarn
		case "error", "dpanic", "panic", "fatal":
			*level = slog.LevelError
		default:
			return verbosity(level)(v)
		}
		return nil
	}
}

func (o *Options) upstreamFlags(fs *flag.FlagSet) {
	fs.Func("grpc-port", "ext_proc gRPC port on all interfaces (sets --grpc-addr; default 9002)", portFlag(&o.GRPCAddr))
	fs.Func("grpc-health-port", "gRPC health port on all interfaces (sets --health-addr; default 9003)", portFlag(&o.HealthAddr))
	fs.Func("metrics-port", "Prometheus metrics port on all interfaces (sets --metrics-addr; default 9090)", portFlag(&o.MetricsAddr))
	fs.StringVar(&o.PoolGroup, "pool-group", o.PoolGroup, "API group of the InferencePool (only "+poolGroup+", the v1 API)")
	fs.BoolVar(&o.LeaderElection, "ha-enable-leader-election", o.LeaderElection, "active-passive replicas: compete for the Lease epp-<namespace>-<pool>.llm-d.ai; only the leader reports ready")
	fs.Var(toggleValue{&o.SecureServing}, "secure-serving", "TLS on the ext_proc port (default: on with Kubernetes discovery, off with --endpoints)")
	fs.StringVar(&o.CertPath, "cert-path", o.CertPath, "directory with tls.crt and tls.key for --secure-serving (default: a self-signed certificate made at start)")
	fs.BoolVar(&o.CertReload, "enable-cert-reload", o.CertReload, "reload --cert-path's files when they change")
	fs.StringVar(&o.TLSMinVersion, "tls-min-version", o.TLSMinVersion, "minimum TLS version: VersionTLS12 (default) or VersionTLS13")
	fs.StringVar(&o.TLSCipherSuites, "tls-cipher-suites", o.TLSCipherSuites, "comma-separated Go cipher-suite names for TLS 1.2")
	fs.Var(toggleValue{&o.MetricsAuth}, "metrics-endpoint-auth", "require a Kubernetes bearer token allowed to get /metrics (TokenReview, SubjectAccessReview; default: on with Kubernetes discovery, off with --endpoints)")
	fs.BoolVar(&o.Tracing, "tracing", o.Tracing, "OpenTelemetry spans over OTLP/gRPC, configured by OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME, ...")
	fs.StringVar(&o.LogFormat, "zap-encoder", o.LogFormat, "log format: console (text) or json")
	fs.Func("zap-log-level", "log level: debug, info, warn, error, or a verbosity number (sets --log-level)", zapLevel(&o.LogLevel))
	fs.Func("v", "log verbosity as the upstream pickers take it: 4 and above is debug (sets --log-level)", verbosity(&o.LogLevel))
	m := &o.ModelServerMetrics
	fs.StringVar(&m.Queued, "total-queued-requests-metric", m.Queued, "queue-length metric (vLLM's or SGLang's)")
	fs.StringVar(&m.Running, "total-running-requests-metric", m.Running, "running-requests metric (vLLM's or SGLang's)")
	fs.StringVar(&m.KVCache, "kv-cache-usage-percentage-metric", m.KVCache, "KV-cache usage metric (vLLM's or SGLang's)")
	fs.StringVar(&m.LoRA, "lora-info-metric", m.LoRA, "LoRA info metric (vLLM's, or empty)")
	fs.StringVar(&m.CacheInfo, "cache-info-metric", m.CacheInfo, "cache config info metric (vLLM's)")
}

// joinBoolValues rewrites `--flag true|false` into `--flag=true|false` for
// boolean flags: the GIE chart renders its flags map that way, and a
// separate "false" would otherwise be a stray argument with the flag
// turned on.
func joinBoolValues(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		name := strings.TrimLeft(a, "-")
		if name != a && !strings.Contains(name, "=") && i+1 < len(args) {
			if f := fs.Lookup(name); f != nil {
				if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
					if v := args[i+1]; v == "true" || v == "false" {
						out = append(out, a+"="+v)
						i++
						continue
					}
				}
			}
		}
		out = append(out, a)
	}
	return out
}

func (o *Options) validateUpstream() error {
	if o.PoolGroup != poolGroup {
		return fmt.Errorf("--pool-group %q: kvgate serves InferencePools of %s (v1) only", o.PoolGroup, poolGroup)
	}
	if o.LogFormat != "console" && o.LogFormat != "json" {
		return fmt.Errorf("--zap-encoder %q: want console or json", o.LogFormat)
	}
	if o.SecureServing == ToggleOff && (o.CertPath != "" || o.CertReload) {
		return errors.New("--cert-path and --enable-cert-reload need --secure-serving")
	}
	if _, err := o.tlsOptions(); err != nil {
		return err
	}
	return o.ModelServerMetrics.check()
}

// tlsOptions are the ext_proc port's TLS settings from the flags.
func (o *Options) tlsOptions() (tlscert.Options, error) {
	t := tlscert.Options{CertPath: o.CertPath, Reload: o.CertReload}
	if t.Reload && t.CertPath == "" {
		return t, errors.New("--enable-cert-reload needs --cert-path")
	}
	if o.TLSMinVersion != "" {
		v, err := tlscert.Version(o.TLSMinVersion)
		if err != nil {
			return t, fmt.Errorf("--tls-min-version: %w", err)
		}
		t.MinVersion = v
	}
	if o.TLSCipherSuites != "" {
		var names []string
		for _, n := range strings.Split(o.TLSCipherSuites, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		ids, err := tlscert.CipherSuites(names)
		if err != nil {
			return t, fmt.Errorf("--tls-cipher-suites: %w", err)
		}
		t.CipherSuites = ids
	}
	return t, nil
}

// kubernetesMode: endpoints come from the cluster, so the picker runs
// there, where the upstream defaults (TLS, authenticated metrics) apply.
// (A configuration's file-discovery is llm-d's deployment without
// Kubernetes, as --endpoints is: Picker.kubernetesMode.)
func (o *Options) kubernetesMode() bool { return o.EndpointsFile == "" }

func newLogger(w io.Writer, o Options) *slog.Logger {
	ho := &slog.HandlerOptions{Level: o.LogLevel}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}
