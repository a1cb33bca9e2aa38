package sidecar

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/cliflag"
)

// KV connectors: the P/D protocols between prefiller and decoder that
// kvgate's sidecar speaks (llm-d's names).
const (
	ConnectorNIXLV2        = "nixlv2"
	ConnectorOffloading    = "offloading"
	ConnectorSharedStorage = "shared-storage"
)

// EC connectors: how encoder outputs reach the prefill/decode stage.
const (
	ECConnectorNIXL    = "ec-nixl"
	ECConnectorExample = "ec-example"
)

// TLS stages of --enable-tls and --tls-insecure-skip-verify.
const (
	stagePrefiller = "prefiller"
	stageDecoder   = "decoder"
	stageEncoder   = "encoder"
)

// poolGroup is the only InferencePool API group kvgate knows.
const poolGroup = "inference.networking.k8s.io"

// Options configure the sidecar; each field is a flag of `kvgate sidecar`
// with llm-d's pd-sidecar name and default unless noted.
type Options struct {
	// Host is where the proxy listens (kvgate's; llm-d listens on every
	// interface, the default "").
	Host string
	// Port is the proxy's port; ModelServerPort the local vLLM's.
	Port            int
	ModelServerPort int
	KVConnector     string
	// ECConnector enables the encode stage (E/P/D); empty skips it.
	ECConnector      string
	DataParallelSize int
	// P2PConnectorPort is the OffloadingConnector p2p tier's port on every
	// pod, injected as remote_port of pulls.
	P2PConnectorPort int
	EnableP2PPull    bool
	// EnableSSRFProtection allows only pool members as prefill, encode and
	// KV-source targets. On by default in kvgate (off in llm-d).
	EnableSSRFProtection bool
	// InferencePool is "namespace/name" or "name" (namespace default);
	// EndpointsFile (kvgate's) is a static pool instead, the picker's
	// --endpoints file.
	InferencePool string
	PoolGroup     string
	EndpointsFile string
	Kubeconfig    string
	// SecureServing serves the proxy over TLS: CertPath's tls.crt and
	// tls.key, or a self-signed certificate.
	SecureServing bool
	CertPath      string
	// EnableTLS and TLSInsecureSkipVerify list stages (prefiller, decoder,
	// encoder) dialled over TLS, and those whose certificate is not
	// checked.
	EnableTLS             []string
	TLSInsecureSkipVerify []string
	// EnablePrefillerSampling picks a random prefiller when the header
	// lists several.
	EnablePrefillerSampling bool
	PrefillMaxRetries       int
	PrefillRetryBackoff     time.Duration
	MaxIdleConnsPerHost     int
	// MetricsPort serves the sidecar's own metrics; 0 turns them off (the
	// proxy port's /metrics is the model server's).
	MetricsPort     int
	DecodeChunkSize int
	// MaxRequestBodyBytes bounds a request body the sidecar reads to
	// rewrite, and what it keeps of a relayed one for a replay (kvgate's).
	MaxRequestBodyBytes int64
	// ReplayBufferBytes bounds what all relayed bodies keep for a replay
	// at once; a request that finds it spent is relayed unreplayable. 0
	// keeps none (kvgate's).
	ReplayBufferBytes int64
	// BodyBudgetBytes bounds the request bodies all P/D requests hold at
	// once while the sidecar rewrites them into their legs; past it a new
	// body gets 503. Negative: unlimited (kvgate's, as the gateway's).
	BodyBudgetBytes int64
	LogLevel        slog.Level

	Logger *slog.Logger
}

// DefaultOptions are the flag defaults; INFERENCE_POOL,
// ENABLE_PREFILLER_SAMPLING and P2P_CONNECTOR_PORT override theirs, as in
// llm-d.
func DefaultOptions() Options {
	o := Options{
		Port: 8000, ModelServerPort: 8200, KVConnector: ConnectorNIXLV2, DataParallelSize: 1,
		P2PConnectorPort: 7777, EnableSSRFProtection: true, InferencePool: os.Getenv("INFERENCE_POOL"),
		PoolGroup: poolGroup, SecureServing: true, PrefillRetryBackoff: 200 * time.Millisecond,
		MaxIdleConnsPerHost: 1024, MaxRequestBodyBytes: 32 << 20, ReplayBufferBytes: 256 << 20, BodyBudgetBytes: 256 << 20,
	}
	if v, err := strconv.ParseBool(os.Getenv("ENABLE_PREFILLER_SAMPLING")); err == nil {
		o.EnablePrefillerSampling = v
	}
	if v, err := strconv.Atoi(os.Getenv("P2P_CONNECTOR_PORT")); err == nil {
		o.P2PConnectorPort = v
	}
	return o
}

// aliasFlags write a field another flag also writes; Args leaves them out.
var aliasFlags = []string{"vllm-port", "secure-proxy", "connector", "zap-log-level"}

type levelFlag struct{ l *slog.Level }

func (f levelFlag) String() string {
	if f.l == nil {
		return ""
	}
	return f.l.String()
}

// Set reads zap's levels (debug, info, error, or a verbosity number, where
// any positive number means debug) and slog's.
func (f levelFlag) Set(v string) error {
	if n, err := strconv.Atoi(v); err == nil {
		*f.l = slog.LevelInfo
		if n > 0 {
			*f.l = slog.LevelDebug
		}
		return nil
	}
	return f.l.UnmarshalText([]byte(v))
}

func (o *Options) flagSet(out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvgate sidecar", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.Host, "host", o.Host, "listen host (default: every interface)")
	fs.IntVar(&o.Port, "port", o.Port, "the port the sidecar listens on (0 picks a free one)")
	fs.IntVar(&o.ModelServerPort, "model-server-port", o.ModelServerPort, "the port the local model server (vLLM) listens on")
	fs.IntVar(&o.ModelServerPort, "vllm-port", o.ModelServerPort, "deprecated: --model-server-port")
	fs.StringVar(&o.KVConnector, "kv-connector", o.KVConnector, "P/D protocol between prefiller and decoder: nixlv2, offloading or shared-storage")
	fs.StringVar(&o.KVConnector, "connector", o.KVConnector, "deprecated: --kv-connector")
	fs.StringVar(&o.ECConnector, "ec-connector", o.ECConnector, "encoder protocol for E/P/D: ec-nixl or ec-example; empty skips the encode stage")
	fs.IntVar(&o.DataParallelSize, "data-parallel-size", o.DataParallelSize, "the model server's data-parallel size (kvgate: 1)")
	fs.IntVar(&o.P2PConnectorPort, "p2p-connector-port", o.P2PConnectorPort, "the OffloadingConnector p2p tier's port, injected as remote_port of KV pulls (env P2P_CONNECTOR_PORT)")
	fs.BoolVar(&o.EnableP2PPull, "enable-p2p-pull", o.EnableP2PPull, "with nixlv2: the engines also run OffloadingConnector's p2p tier, so x-kv-cache-source-host-port pulls are injected")
	fs.BoolVar(&o.EnableSSRFProtection, "enable-ssrf-protection", o.EnableSSRFProtection, "dial only inference-pool members as prefill, encode and KV-source targets (403 otherwise)")
	fs.StringVar(&o.InferencePool, "inference-pool", o.InferencePool, "the InferencePool whose members may be dialled: namespace/name or name (env INFERENCE_POOL)")
	fs.StringVar(&o.PoolGroup, "pool-group", o.PoolGroup, "API group of the InferencePool")
	fs.StringVar(&o.EndpointsFile, "endpoints", o.EndpointsFile, "static pool instead of --inference-pool: the picker's endpoints YAML file, watched for changes")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig for --inference-pool (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
	fs.BoolVar(&o.SecureServing, "secure-serving", o.SecureServing, "serve the proxy over TLS")
	fs.BoolVar(&o.SecureServing, "secure-proxy", o.SecureServing, "deprecated: --secure-serving")
	fs.StringVar(&o.CertPath, "cert-path", o.CertPath, "folder with tls.crt and tls.key for --secure-serving (empty: a self-signed certificate)")
	fs.Var(cliflag.List{Vals: &o.EnableTLS}, "enable-tls", "stages dialled over TLS: prefiller, decoder, encoder (comma list)")
	fs.Var(cliflag.List{Vals: &o.TLSInsecureSkipVerify}, "tls-insecure-skip-verify", "stages whose TLS certificate is not verified (comma list)")
	fs.BoolVar(&o.EnablePrefillerSampling, "enable-prefiller-sampling", o.EnablePrefillerSampling, "pick a random prefiller among those the header lists (env ENABLE_PREFILLER_SAMPLING)")
	fs.IntVar(&o.PrefillMaxRetries, "prefill-max-retries", o.PrefillMaxRetries, "retries of a prefill leg answered 502, 503 or 504")
	fs.DurationVar(&o.PrefillRetryBackoff, "prefill-retry-backoff", o.PrefillRetryBackoff, "wait between prefill retries")
	fs.IntVar(&o.MaxIdleConnsPerHost, "max-idle-conns-per-host", o.MaxIdleConnsPerHost, "idle keep-alive connections kept per upstream")
	fs.IntVar(&o.MetricsPort, "metrics-port", o.MetricsPort, "port of the sidecar's own /metrics (0: off)")
	fs.IntVar(&o.DecodeChunkSize, "decode-chunk-size", o.DecodeChunkSize, "chunked decode token budget (kvgate: 0 only)")
	fs.Int64Var(&o.MaxRequestBodyBytes, "max-request-body-bytes", o.MaxRequestBodyBytes, "largest request body the sidecar reads, and the most of a relayed body kept to replay it after a stale connection")
	fs.Int64Var(&o.ReplayBufferBytes, "replay-buffer-bytes", o.ReplayBufferBytes, "the most bytes of relayed bodies kept at once, all requests together, to replay them after a stale connection; a request past it is relayed but not replayed (0: none kept)")
	fs.Int64Var(&o.BodyBudgetBytes, "body-budget-bytes", o.BodyBudgetBytes, "request body bytes all P/D requests together may hold while their legs are rewritten; beyond it new bodies get 503 (<0: unlimited)")
	fs.Var(levelFlag{&o.LogLevel}, "log-level", "log level: debug, info, warn, error")
	fs.Var(levelFlag{&o.LogLevel}, "zap-log-level", "llm-d's log level flag: debug, info, error or a verbosity number")
	return fs
}

// Args is the command line (after `kvgate sidecar`) that parses back to o.
func (o Options) Args() []string {
	def := DefaultOptions()
	return cliflag.Args(o.flagSet(io.Discard), def.flagSet(io.Discard), aliasFlags...)
}

// ParseFlags parses `kvgate sidecar` arguments.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := o.flagSet(stderr)
	if err := cliflag.Parse(fs, args); err != nil {
		return o, err
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "vllm-port", "secure-proxy", "connector":
			fmt.Fprintf(stderr, "kvgate sidecar: --%s is deprecated\n", f.Name)
		}
	})
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.LogLevel}))
	return o, o.validate()
}

// validate refuses what kvgate's sidecar does not do rather than
// accepting it and doing something else.
func (o *Options) validate() error {
	switch o.KVConnector {
	case ConnectorNIXLV2, ConnectorOffloading, ConnectorSharedStorage:
	case "sglang", "mooncake", "nixl", "lmcache":
		return fmt.Errorf("--kv-connector %q: llm-d's connector, not implemented by kvgate's sidecar (nixlv2, offloading, shared-storage)", o.KVConnector)
	default:
		return fmt.Errorf("--kv-connector %q: want nixlv2, offloading or shared-storage", o.KVConnector)
	}
	switch o.ECConnector {
	case "", ECConnectorNIXL, ECConnectorExample:
	default:
		return fmt.Errorf("--ec-connector %q: want ec-nixl, ec-example or empty", o.ECConnector)
	}
	for _, list := range [][]string{o.EnableTLS, o.TLSInsecureSkipVerify} {
		for _, s := range list {
			if s != stagePrefiller && s != stageDecoder && s != stageEncoder {
				return fmt.Errorf("TLS stage %q: want prefiller, decoder or encoder", s)
			}
		}
	}
	switch {
	case o.Port < 0 || o.Port > 65535 || o.ModelServerPort < 1 || o.ModelServerPort > 65535:
		return errors.New("--port and --model-server-port must be ports (1-65535; --port 0 picks one)")
	case o.P2PConnectorPort < 1 || o.P2PConnectorPort > 65535:
		return fmt.Errorf("--p2p-connector-port %d out of range", o.P2PConnectorPort)
	case o.MetricsPort < 0 || o.MetricsPort > 65535:
		return fmt.Errorf("--metrics-port %d out of range", o.MetricsPort)
	case o.DataParallelSize != 1:
		return fmt.Errorf("--data-parallel-size %d: kvgate's sidecar serves one rank (1)", o.DataParallelSize)
	case o.DecodeChunkSize != 0:
		return errors.New("--decode-chunk-size: chunked decode is not implemented by kvgate's sidecar (0 only)")
	case o.EnableP2PPull && o.KVConnector != ConnectorNIXLV2:
		return errors.New("--enable-p2p-pull is for --kv-connector nixlv2 (offloading pulls without it)")
	case o.PrefillMaxRetries < 0 || o.PrefillRetryBackoff < 0:
		return errors.New("--prefill-max-retries and --prefill-retry-backoff must not be negative")
	case o.MaxIdleConnsPerHost < 1 || o.MaxRequestBodyBytes < 1:
		return errors.New("--max-idle-conns-per-host and --max-request-body-bytes must be positive")
	case o.BodyBudgetBytes == 0:
		return errors.New("--body-budget-bytes 0 would refuse every P/D body; use a negative value for no limit")
	case o.ReplayBufferBytes < 0:
		return fmt.Errorf("--replay-buffer-bytes %d: must not be negative (0 keeps no relayed body for a replay)", o.ReplayBufferBytes)
	case o.PoolGroup != poolGroup:
		return fmt.Errorf("--pool-group %q: kvgate knows InferencePools of %s only", o.PoolGroup, poolGroup)
	case o.EndpointsFile != "" && o.InferencePool != "":
		return errors.New("--endpoints and --inference-pool are exclusive: the pool comes from a file or from Kubernetes")
	case o.EnableSSRFProtection && o.EndpointsFile == "" && o.InferencePool == "":
		return errors.New("--enable-ssrf-protection (on by default) needs the pool: --inference-pool (or INFERENCE_POOL) or --endpoints; --enable-ssrf-protection=false dials any target the headers name")
	}
	return nil
}

func (o *Options) tls(stage string) bool { return slices.Contains(o.EnableTLS, stage) }
func (o *Options) skipVerify(stage string) bool {
	return slices.Contains(o.TLSInsecureSkipVerify, stage)
}

// Main runs `kvgate sidecar` until ctx ends.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	o, err := ParseFlags(args, stderr)
	if err != nil {
		return err
	}
	s, err := New(o)
	if err != nil {
		return err
	}
	attrs := []any{"addr", s.Addr().String(), "model_server_port", o.ModelServerPort, "kv_connector", o.KVConnector,
		"ec_connector", o.ECConnector, "ssrf_protection", o.EnableSSRFProtection, "tls", o.SecureServing}
	if a := s.MetricsAddr(); a != nil {
		attrs = append(attrs, "metrics", a.String())
	}
	o.Logger.Info("kvgate sidecar listening", attrs...)
	return s.Run(ctx)
}
