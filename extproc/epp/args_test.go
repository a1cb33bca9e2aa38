package epp

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/kvevents"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/cliflag/cliflagtest"
	"github.com/kvgate/kvgate/internal/memlimit"
	"github.com/kvgate/kvgate/internal/testutil"
)

// A command line built from Options parses back to the same Options.
func TestArgsRoundTrip(t *testing.T) {
	full := Options{
		ConfigText: "kind: EndpointPickerConfig", EndpointsFile: "/tmp/eps.yaml", ObjectivesFile: "/tmp/objectives.yaml",
		GRPCAddr: "127.0.0.1:1", HealthAddr: "127.0.0.1:2", MetricsAddr: "127.0.0.1:3",
		RefreshMetricsInterval: 50 * time.Millisecond, PoolName: "p", PoolNamespace: "ns",
		Kubeconfig: "/k", KVEventsAddr: "tcp://127.0.0.1:4", TrustFilterHeaders: true, EnginePriority: true,
		MaxRequestBodyBytes: 123, MaxRequestHeaders: 5, MaxRequestHeaderBytes: 6, RequestBodyBudgetBytes: 7, MemoryLimit: 1 << 30,
		RequestIdleTimeout: time.Second, ResponseIdleTimeout: time.Minute, MaxEndpoints: 8, DrainTimeout: 2 * time.Second, LogLevel: slog.LevelDebug,
		LogFormat: "json", PoolGroup: poolGroup, LeaderElection: true, SecureServing: ToggleOn,
		CertPath: "/certs", CertReload: true, TLSMinVersion: "VersionTLS13",
		TLSCipherSuites: "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", MetricsAuth: ToggleOff, Tracing: true,
		KVEvents: KVEventLimits{MaxConns: 3, MaxMessageBytes: 4, MemoryBudgetBytes: 6, PublisherMemoryBytes: 5, PublisherRate: -1,
			PublisherBytesPerSecond: 1e6, HandshakeTimeout: time.Second, TrustedCIDRs: "10.0.0.0/8", TLSCertPath: "/kvcerts", DataParallelRanks: 2},
		Telemetry: TelemetryOptions{Agents: []string{"10.0.0.1:7600", "10.0.0.2:7600"}, AgentSelector: "app=kvgate-agent", AgentPort: 7601, Interval: 2 * time.Second},
		ModelServerMetrics: MetricNames{Queued: "sglang:num_queue_reqs", Running: "sglang:num_running_reqs",
			KVCache: "sglang:token_usage", CacheInfo: "vllm:cache_config_info"},
	}
	// Exclusive with the file-based ones above, so set in their own options.
	k8s := DefaultOptions()
	k8s.ConfigFile, k8s.EndpointSelector, k8s.EndpointTargetPorts = "/c.yaml", "app=vllm", []int{8000, 8001}
	cliflagtest.AllSet(t, full, "ConfigFile", "EndpointSelector", "EndpointTargetPorts")
	parse := func(args []string) (Options, error) { return ParseFlags(args, io.Discard) }
	cliflagtest.RoundTrip(t, parse, Options.Args, DefaultOptions(), full, k8s)
}

func TestLoadObjectives(t *testing.T) {
	objs, err := loadObjectives("testdata/flow-control-objectives.yaml", "flow-control")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"premium-traffic": 100, "standard-traffic": 0, "best-effort-traffic": -10} {
		if p, ok := objs.Priority(name); !ok || p != want {
			t.Errorf("%s: %d %v, want %d", name, p, ok, want)
		}
	}
	if other, err := loadObjectives("testdata/flow-control-objectives.yaml", "another-pool"); err != nil || len(other) != 0 {
		t.Errorf("another pool's objectives: %v %v", other, err)
	}
	dir := t.TempDir()
	for i, bad := range []string{
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferencePool\nmetadata: {name: x}\n",
		"apiVersion: v1\nkind: InferenceObjective\nmetadata: {name: x}\n",
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nspec: {priority: 1}\n",
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\nspec: {priority: 9999999999, poolRef: {name: p}}\n",
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\nspec: {priority: high}\n",
	} {
		path := filepath.Join(dir, fmt.Sprint(i, ".yaml"))
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := loadObjectives(path, "p"); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if _, err := ParseFlags([]string{"--objectives", "x.yaml"}, io.Discard); err == nil {
		t.Error("--objectives without --endpoints accepted")
	}
}

// --memory-limit reaches the runtime: auto is the body and KV-event
// budgets plus the headroom, a size is taken as given, 0 is none, and GOMEMLIMIT wins.
func TestMemoryLimitFlag(t *testing.T) {
	parse := func(args []string) (testutil.ApplyMemoryLimit, error) {
		o, err := ParseFlags(args, io.Discard)
		return o.ApplyMemoryLimit, err
	}
	testutil.MemoryLimitFlag(t, parse, []testutil.MemoryLimitCase{
		{Args: nil, Want: server.DefaultBodyBudgetBytes + kvevents.DefaultMemoryBudget + memlimit.Headroom},
		{Args: []string{"--request-body-budget-bytes", "1048576", "--kv-events-memory-budget-bytes", "33554432"}, Want: 1<<20 + 32<<20 + memlimit.Headroom},
		{Args: []string{"--memory-limit", "3GiB"}, Want: 3 << 30},
		{Args: []string{"--memory-limit=0"}, Want: math.MaxInt64},
		{Args: []string{"--request-body-budget-bytes", "-1"}, Want: math.MaxInt64},
	}, "-5")
}
