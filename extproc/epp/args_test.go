package epp

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/cliflag/cliflagtest"
)

// A command line built from Options parses back to the same Options.
func TestArgsRoundTrip(t *testing.T) {
	full := Options{
		ConfigText: "kind: EndpointPickerConfig", EndpointsFile: "/tmp/eps.yaml",
		GRPCAddr: "127.0.0.1:1", HealthAddr: "127.0.0.1:2", MetricsAddr: "127.0.0.1:3",
		RefreshMetricsInterval: 50 * time.Millisecond, PoolName: "p", PoolNamespace: "ns",
		Kubeconfig: "/k", KVEventsAddr: "tcp://127.0.0.1:4", TrustFilterHeaders: true,
		MaxRequestBodyBytes: 123, DrainTimeout: 2 * time.Second, LogLevel: slog.LevelDebug,
		LogFormat: "json", PoolGroup: poolGroup, LeaderElection: true, SecureServing: ToggleOn,
		CertPath: "/certs", CertReload: true, TLSMinVersion: "VersionTLS13",
		TLSCipherSuites: "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", MetricsAuth: ToggleOff, Tracing: true,
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
