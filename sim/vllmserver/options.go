package vllmserver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/cliflag"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/prompt"
	"github.com/kvgate/kvgate/internal/tokenizer"
	"github.com/kvgate/kvgate/sim/engine"
)

// Role is the part a server plays in P/D disaggregation.
type Role string

// Roles. A prefill server refuses decode legs (do_remote_prefill) and a
// decode server refuses prefill legs (do_remote_decode), which catches a
// miswired demo; both serves either, as vLLM's kv_both does.
const (
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
	RoleBoth    Role = "both"
	// RoleEncode is E/P/D's encode server: it serves chat requests with
	// multimodal parts only, and answers with the ec_transfer_params that
	// name its encoder outputs.
	RoleEncode Role = "encode"
)

// LoRAModule is one --lora-modules entry: an adapter servable by name.
type LoRAModule struct {
	Name string
	Path string
}

// Options configure a Server; each field is a flag of `kvgate sim`.
type Options struct {
	// Host and Port are where HTTP listens; port 0 picks a free one.
	Host string
	Port int
	// AdvertiseHost is the host peers reach this server on: the
	// kv_transfer_params remote_host and the default KV-events topic
	// (a pod's IP). Default: the bound IP, or 127.0.0.1 for a wildcard.
	AdvertiseHost string
	// Model is the model path or name; ServedModelNames default to it.
	Model            string
	ServedModelNames []string
	// TokenizerDir holds tokenizer.json and tokenizer_config.json; ignored
	// when Tokenizer is set (in-process fleets share one).
	TokenizerDir string
	Tokenizer    *tokenizer.Tokenizer
	// TokenizerCacheBytes bounds the prefix cache that spares repeated
	// long prompts a second tokenization.
	TokenizerCacheBytes int

	// Preset names the sim/engine timing model.
	Preset              string
	BlockSize           int
	NumGPUBlocks        int
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	MaxModelLen         int
	MaxWaiting          int
	// SchedulingPolicy is vLLM's --scheduling-policy: fcfs, or priority
	// (the waiting queue by the body's "priority", lower first, then
	// arrival).
	SchedulingPolicy string
	HashSeed         string
	LoRAModules      []LoRAModule
	MaxLoRAs         int
	// HeldBlockTimeout frees a prefill's blocks that no decoder released
	// (simulated time).
	HeldBlockTimeout time.Duration

	Role Role
	// MMTokensPerItem is how many prompt tokens one multimodal item
	// takes (its placeholders, and its encoder work).
	MMTokensPerItem int
	// TimeScale runs the engine this many times faster than wall time.
	TimeScale float64
	// FailureRate is the fraction of valid requests answered with an
	// injected 500.
	FailureRate float64
	// Seed makes request ids, hence generated tokens, and injected
	// failures reproducible.
	Seed uint64
	// Echo answers with the prompt's own tokens (chat: the last message's)
	// instead of random ones.
	Echo bool
	// DefaultMaxTokens applies when a request sets none. vLLM's chat API
	// would generate up to the context limit, but a simulated model never
	// emits EOS, so the simulator caps it like the completions default.
	DefaultMaxTokens int
	// MaxRequestBodyBytes bounds a request body.
	MaxRequestBodyBytes int64

	// KVEventsEndpoint enables KV events: bound when it contains "*",
	// connected otherwise, as vLLM does.
	KVEventsEndpoint       string
	KVEventsReplayEndpoint string
	// KVEventsTopic defaults to kv@<host:port>@<served model name>.
	KVEventsTopic    string
	KVEventsEncoding kvwire.Encoding

	// Agent is the node agent's gRPC address (kvgate-agent): KV bytes then
	// really move, through a shared region the agent registers with NIXL.
	Agent string
	// KVBytesPerToken sizes a block's bytes (0: the preset model's real
	// KV size per token).
	KVBytesPerToken int
	// KVRegionBytes caps the shared region (slots: the engine's block
	// count, or fewer to fit); KVRegionDir holds its file (/dev/shm).
	KVRegionBytes int64
	KVRegionDir   string
	// KVLoadFailurePolicy is vLLM's kv_load_failure_policy: fail or
	// recompute.
	KVLoadFailurePolicy string
	// KVTransferTimeout bounds one pull.
	KVTransferTimeout time.Duration
	// KVTransferConfig is vLLM's --kv-transfer-config JSON: kv_connector
	// NixlConnector (the default), SharedStorageConnector
	// (shared_storage_path) or OffloadingConnector (TieringOffloadingSpec
	// with one p2p secondary tier); see kvconnector.go.
	KVTransferConfig string
	// KVAllowedHosts are the hosts (IP addresses, CIDR prefixes, names)
	// besides loopback addresses and localhost that a request's
	// kv_transfer_params may make this server dial: a decode leg's
	// release_kv to its prefiller, a pull through --agent (do_remote_prefill,
	// remote_kv_source) and an OffloadingConnector remote_prefiller pull.
	// The body names the host, so a client that reaches this server could
	// otherwise make it dial anywhere.
	KVAllowedHosts []string
	// KVOffloadEventsEndpoint is where the agent publishes this server's
	// CPU-tier KV events (medium "CPU"); empty for none.
	KVOffloadEventsEndpoint string

	Logger *slog.Logger
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		Host:                "0.0.0.0",
		Port:                8000,
		Model:               "Qwen/Qwen3-0.6B",
		TokenizerDir:        defaultTokenizerDir(),
		TokenizerCacheBytes: 32 << 20,
		Preset:              "qwen3-0.6b-h100",
		BlockSize:           kvhash.DefaultBlockSize,
		HashSeed:            kvhash.DefaultSeed,
		SchedulingPolicy:    string(engine.SchedulingFCFS),
		HeldBlockTimeout:    480 * time.Second,
		Role:                RoleBoth,
		MMTokensPerItem:     prompt.DefaultTokensPerItem,
		TimeScale:           1,
		DefaultMaxTokens:    16,
		MaxRequestBodyBytes: 32 << 20,
		KVRegionBytes:       1 << 30,
		KVLoadFailurePolicy: PolicyFail,
		KVTransferTimeout:   10 * time.Second,
	}
}

// defaultTokenizerDir is where `make setup` puts the Qwen3 tokenizer,
// relative to the repository root `kvgate sim` is normally run from.
func defaultTokenizerDir() string {
	if d := os.Getenv("KVGATE_TOKENIZER_DIR"); d != "" {
		return d
	}
	return ".cache/tokenizers/qwen3"
}

// multiValued are the flags vLLM takes as space-separated lists
// (argparse nargs="+").
var multiValued = map[string]bool{"served-model-name": true, "lora-modules": true}

// expandLists rewrites "--f a b" into "--f a --f b" for multiValued flags,
// so that vLLM command lines parse with the flag package.
func expandLists(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if !strings.HasPrefix(a, "-") || !multiValued[strings.TrimLeft(a, "-")] {
			continue
		}
		// The first value follows as usual; each further one gets the flag
		// again.
		for i+2 < len(args) && !strings.HasPrefix(args[i+2], "-") {
			out = append(out, args[i+1], a)
			i++
		}
	}
	return out
}

// ParseFlags parses `kvgate sim` arguments. Like `vllm serve`, the model
// may come first as a positional argument.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("kvgate sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		loras     []string
		encoding  = "array"
		role      = string(o.Role)
		logLevel  slog.Level
		servedRaw []string
	)
	fs.StringVar(&o.Host, "host", o.Host, "HTTP listen host")
	fs.IntVar(&o.Port, "port", o.Port, "HTTP listen port (0 picks a free one)")
	fs.StringVar(&o.AdvertiseHost, "advertise-host", o.AdvertiseHost, "host peers reach this server on, for kv_transfer_params and the KV-events topic (default: the bound IP, 127.0.0.1 for a wildcard)")
	fs.StringVar(&o.Model, "model", o.Model, "model name or path")
	fs.Var(cliflag.List{Vals: &servedRaw, Sep: " "}, "served-model-name", "model names clients may use (several allowed; default --model)")
	fs.StringVar(&o.TokenizerDir, "tokenizer", o.TokenizerDir, "folder with tokenizer.json and tokenizer_config.json (env KVGATE_TOKENIZER_DIR)")
	fs.StringVar(&o.Preset, "preset", o.Preset, "engine timing preset (model × GPU)")
	fs.IntVar(&o.BlockSize, "block-size", o.BlockSize, "tokens per KV block")
	fs.IntVar(&o.NumGPUBlocks, "num-gpu-blocks", o.NumGPUBlocks, "KV-cache blocks (0: derived from the preset's GPU memory)")
	fs.IntVar(&o.MaxNumSeqs, "max-num-seqs", o.MaxNumSeqs, "largest running batch (0: 256)")
	fs.IntVar(&o.MaxNumBatchedTokens, "max-num-batched-tokens", o.MaxNumBatchedTokens, "token budget per step (0: 8192)")
	fs.IntVar(&o.MaxModelLen, "max-model-len", o.MaxModelLen, "context length (0: the model's)")
	fs.IntVar(&o.MaxWaiting, "max-waiting", o.MaxWaiting, "waiting-queue bound; beyond it requests get 429 (0: 1024)")
	fs.StringVar(&o.SchedulingPolicy, "scheduling-policy", o.SchedulingPolicy, "fcfs, or priority: waiting requests by their body's priority (lower first), then arrival; under fcfs a non-zero priority is refused (400)")
	fs.StringVar(&o.HashSeed, "hash-seed", o.HashSeed, "PYTHONHASHSEED of the block-hash chain; the picker must use the same")
	fs.Var(cliflag.List{Vals: &loras, Sep: " "}, "lora-modules", "LoRA adapters as name=path (several allowed); names become servable models")
	fs.IntVar(&o.MaxLoRAs, "max-loras", o.MaxLoRAs, "adapters per batch (0 with --lora-modules: 1)")
	fs.DurationVar(&o.HeldBlockTimeout, "kv-held-timeout", o.HeldBlockTimeout, "free a prefill's KV blocks no decoder released after this long (simulated)")
	fs.StringVar(&role, "role", role, "P/D role: prefill, decode, both or encode (E/P/D)")
	fs.IntVar(&o.MMTokensPerItem, "mm-tokens-per-item", o.MMTokensPerItem, "placeholder tokens of one image, audio or video item in a chat prompt")
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "run the engine this many times faster than real time; reported latencies are simulated seconds")
	fs.Float64Var(&o.FailureRate, "failure-rate", o.FailureRate, "fraction of requests answered with an injected 500")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of request ids (hence generated tokens) and injected failures")
	fs.BoolVar(&o.Echo, "echo", o.Echo, "answer with the prompt's tokens instead of random ones")
	fs.IntVar(&o.DefaultMaxTokens, "default-max-tokens", o.DefaultMaxTokens, "max_tokens of requests that set none")
	fs.StringVar(&o.KVEventsEndpoint, "kv-events-endpoint", o.KVEventsEndpoint, "ZMQ endpoint for KV events, e.g. tcp://*:5557 (bound) or tcp://127.0.0.1:5557 (connected); empty disables them")
	fs.StringVar(&o.KVEventsReplayEndpoint, "kv-events-replay-endpoint", o.KVEventsReplayEndpoint, "ZMQ ROUTER endpoint serving event replay")
	fs.StringVar(&o.KVEventsTopic, "kv-events-topic", o.KVEventsTopic, "KV events topic (default kv@<host:port>@<model>)")
	fs.StringVar(&encoding, "kv-events-format", encoding, "KV events encoding: array or map")
	fs.TextVar(&logLevel, "log-level", logLevel, "log level: debug, info, warn, error")
	fs.StringVar(&o.Agent, "agent", o.Agent, "node agent (kvgate-agent) gRPC address: KV blocks then move for real (P/D pulls, CPU offload, P2P)")
	fs.IntVar(&o.KVBytesPerToken, "kv-bytes-per-token", o.KVBytesPerToken, "KV bytes per token with --agent (0: the preset model's real size)")
	fs.Int64Var(&o.KVRegionBytes, "kv-region-bytes", o.KVRegionBytes, "cap of the shared KV region with --agent")
	fs.StringVar(&o.KVRegionDir, "kv-region-dir", o.KVRegionDir, "folder of the shared KV region file (default /dev/shm)")
	fs.StringVar(&o.KVLoadFailurePolicy, "kv-load-failure-policy", o.KVLoadFailurePolicy, "on a failed KV pull: fail the request or recompute the prompt (vLLM kv_load_failure_policy)")
	fs.DurationVar(&o.KVTransferTimeout, "kv-transfer-timeout", o.KVTransferTimeout, "bound on one KV pull with --agent")
	fs.StringVar(&o.KVTransferConfig, "kv-transfer-config", o.KVTransferConfig, `vLLM's KV connector JSON: {"kv_connector": "NixlConnector" | "SharedStorageConnector" | "OffloadingConnector", "kv_role", "kv_connector_extra_config"}`)
	fs.Var(cliflag.List{Vals: &o.KVAllowedHosts, Sep: ","}, "kv-allowed-hosts", "hosts besides loopback and localhost that kv_transfer_params may make this server dial (release_kv, pulls through --agent, OffloadingConnector pulls): IP addresses, CIDR prefixes or names, comma-separated; several allowed")
	fs.StringVar(&o.KVOffloadEventsEndpoint, "kv-offload-events-endpoint", o.KVOffloadEventsEndpoint, "ZMQ endpoint where the agent publishes this server's CPU-tier KV events")

	args = expandLists(args)
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		o.Model, args = args[0], args[1:]
	}
	if err := cliflag.Parse(fs, args); err != nil {
		return o, err
	}
	o.ServedModelNames = servedRaw
	for _, l := range loras {
		name, path, ok := strings.Cut(l, "=")
		if !ok || name == "" {
			return o, fmt.Errorf("--lora-modules %q: want name=path", l)
		}
		o.LoRAModules = append(o.LoRAModules, LoRAModule{Name: name, Path: path})
	}
	var err error
	if o.KVEventsEncoding, err = kvwire.ParseEncoding(encoding); err != nil {
		return o, err
	}
	o.Role = Role(role)
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel}))
	_, err = o.validate()
	return o, err
}

// validated is what validate parsed, so that New does not parse it again.
type validated struct {
	kvc   *kvTransferConfig // nil: NixlConnector semantics by default
	allow allowList
}

// validate checks what the engine does not, and returns the parsed
// --kv-transfer-config and --kv-allowed-hosts.
func (o *Options) validate() (validated, error) {
	if err := o.check(); err != nil {
		return validated{}, err
	}
	kvc, err := parseKVTransferConfig(o.KVTransferConfig)
	if err != nil {
		return validated{}, err
	}
	if kvc != nil && kvc.Connector != ConnectorNixl && o.Agent != "" {
		return validated{}, fmt.Errorf("--kv-transfer-config kv_connector %s: not with --agent, whose data plane is the NixlConnector's", kvc.Connector)
	}
	allow, err := parseAllowList(o.KVAllowedHosts)
	if err != nil {
		return validated{}, err
	}
	// A prefill leg serves no do_remote_prefill, so without an agent or a
	// p2p tier it never dials a host a request names.
	if len(o.KVAllowedHosts) > 0 && o.Role == RolePrefill && o.Agent == "" && (kvc == nil || kvc.Connector != ConnectorOffloading) {
		return validated{}, fmt.Errorf("--kv-allowed-hosts %s: a prefill-role server without --agent or an OffloadingConnector dials no host a request names", strings.Join(o.KVAllowedHosts, ","))
	}
	return validated{kvc: kvc, allow: allow}, nil
}

// check validates the flags that need no parsing.
func (o *Options) check() error {
	switch o.Role {
	case RolePrefill, RoleDecode, RoleBoth, RoleEncode:
	default:
		return fmt.Errorf("--role %q: want prefill, decode, both or encode", o.Role)
	}
	switch {
	case !(o.TimeScale > 0):
		return fmt.Errorf("--time-scale %v must be positive", o.TimeScale)
	case !(o.FailureRate >= 0 && o.FailureRate <= 1):
		return fmt.Errorf("--failure-rate %v must be within [0, 1]", o.FailureRate)
	case o.MMTokensPerItem < 1:
		return fmt.Errorf("--mm-tokens-per-item %d must be positive", o.MMTokensPerItem)
	case o.DefaultMaxTokens < 1:
		return fmt.Errorf("--default-max-tokens %d must be positive", o.DefaultMaxTokens)
	case o.Port < 0 || o.Port > 65535:
		return fmt.Errorf("--port %d out of range", o.Port)
	case o.Model == "":
		return errors.New("--model is required")
	case o.SchedulingPolicy != string(engine.SchedulingFCFS) && o.SchedulingPolicy != string(engine.SchedulingPriority):
		return fmt.Errorf("--scheduling-policy %q: want fcfs or priority", o.SchedulingPolicy)
	case o.KVLoadFailurePolicy != PolicyFail && o.KVLoadFailurePolicy != PolicyRecompute:
		return fmt.Errorf("--kv-load-failure-policy %q: want fail or recompute", o.KVLoadFailurePolicy)
	case o.KVBytesPerToken < 0 || o.KVRegionBytes <= 0 || o.KVTransferTimeout <= 0:
		return errors.New("--kv-bytes-per-token must not be negative, --kv-region-bytes and --kv-transfer-timeout must be positive")
	}
	seen := make(map[string]bool)
	for _, n := range o.servedNames() {
		seen[n] = true
	}
	for _, l := range o.LoRAModules {
		if seen[l.Name] {
			return fmt.Errorf("model name %q is used twice", l.Name)
		}
		seen[l.Name] = true
	}
	return nil
}

func (o *Options) servedNames() []string {
	if len(o.ServedModelNames) > 0 {
		return o.ServedModelNames
	}
	return []string{o.Model}
}

// Main runs `kvgate sim` with command-line args until ctx ends. The
// simulator logs to stderr and writes nothing to stdout.
func Main(ctx context.Context, args []string, _, stderr io.Writer) error {
	o, err := ParseFlags(args, stderr)
	if err != nil {
		return err
	}
	s, err := New(o)
	if err != nil {
		return err
	}
	o.Logger.Info("kvgate sim listening", "addr", s.Addr().String(), "models", s.models.names(),
		"preset", o.Preset, "kv_events", s.KVEventsAddr(), "topic", s.topic)
	return s.Run(ctx)
}
