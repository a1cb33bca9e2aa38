package epp

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/extproc/endpoints/k8s/k8stest"
	"github.com/kvgate/kvgate/internal/testutil"
)

var suite k8stest.Suite

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// The argument lists the upstream charts render parse, with their meaning.
func TestUpstreamArgs(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, o Options)
	}{
		{
			name: "GIE v1.5 inferencepool chart",
			args: []string{"--pool-name", "qwen", "--pool-namespace", "llm", "--pool-group", "inference.networking.k8s.io",
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--v", "1", "--tracing=false"},
			check: func(t *testing.T, o Options) {
				if o.PoolName != "qwen" || o.PoolNamespace != "llm" || o.ConfigFile != "/config/default-plugins.yaml" || o.LogFormat != "json" || o.Tracing {
					t.Errorf("options = %+v", o)
				}
				if !o.SecureServing.On(o.kubernetesMode()) || !o.MetricsAuth.On(o.kubernetesMode()) {
					t.Error("in Kubernetes, TLS and metrics auth are on unless turned off, as upstream")
				}
			},
		},
		{
			name: "llm-d-router chart, two replicas",
			args: []string{"--pool-name", "qwen", "--pool-namespace", "llm", "--pool-group", "inference.networking.k8s.io",
				"--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--ha-enable-leader-election",
				"--grpc-health-port", "9013", "--v=4", "--secure-serving=false", "--tracing=true", "--metrics-endpoint-auth=false"},
			check: func(t *testing.T, o Options) {
				if !o.LeaderElection || o.HealthAddr != ":9013" || o.LogLevel != slog.LevelDebug || !o.Tracing {
					t.Errorf("options = %+v", o)
				}
				if o.SecureServing.On(true) || o.MetricsAuth.On(true) {
					t.Error("explicit false ignored")
				}
			},
		},
		{
			// The GIE chart renders its flags map as "--name", "value".
			name: "GIE flags map with a boolean",
			args: []string{"--pool-name", "p", "--secure-serving", "false", "--grpc-port", "9102", "--metrics-port", "9190"},
			check: func(t *testing.T, o Options) {
				if o.SecureServing != ToggleOff || o.GRPCAddr != ":9102" || o.MetricsAddr != ":9190" {
					t.Errorf("options = %+v", o)
				}
			},
		},
		{
			name: "GIE chart, modelServerType sglang",
			args: []string{"--pool-name", "p", `--total-queued-requests-metric="sglang:num_queue_reqs"`,
				`--total-running-requests-metric="sglang:num_running_reqs"`, `--kv-cache-usage-percentage-metric="sglang:token_usage"`},
			check: func(t *testing.T, o Options) {
				if o.ModelServerMetrics.KVCache != `"sglang:token_usage"` {
					t.Errorf("metric names = %+v", o.ModelServerMetrics)
				}
			},
		},
		{
			name: "TLS settings",
			args: []string{"--pool-name", "p", "--cert-path", "/certs", "--enable-cert-reload", "--tls-min-version", "VersionTLS13",
				"--zap-log-level", "debug"},
			check: func(t *testing.T, o Options) {
				if o.CertPath != "/certs" || !o.CertReload || o.TLSMinVersion != "VersionTLS13" || o.LogLevel != slog.LevelDebug {
					t.Errorf("options = %+v", o)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}
}

func TestUpstreamArgErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--enable-pprof"}, "enable-pprof"},
		{[]string{"--pool-group", "inference.networking.x-k8s.io"}, "inference.networking.x-k8s.io"},
		{[]string{"--kv-cache-usage-percentage-metric", "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"}, "kv-cache-usage-percentage-metric"},
		{[]string{"--total-queued-requests-metric=trtllm_num_requests_waiting"}, "total-queued-requests-metric"},
		{[]string{"--zap-encoder", "logfmt"}, "zap-encoder"},
		{[]string{"--v", "loud"}, "verbosity"},
		{[]string{"--grpc-port", "70000"}, "grpc-port"},
		{[]string{"--enable-cert-reload"}, "--cert-path"},
		{[]string{"--secure-serving=false", "--cert-path", "/c"}, "--secure-serving"},
		{[]string{"--tls-min-version", "1.3"}, "tls-min-version"},
		{[]string{"--tls-cipher-suites", "TLS_FAST"}, "tls-cipher-suites"},
		{[]string{"--tracing", "maybe"}, "maybe"},
	}
	for _, tc := range tests {
		_, err := ParseFlags(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFlags(%q) = %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

func healthStatus(t *testing.T, conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return r.GetStatus()
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// The service names the upstream probes ask for are served.
func TestHealthServiceNames(t *testing.T) {
	f := startFleet(t, "")
	_, healthAddr, _ := f.picker.Addrs()
	conn := dial(t, healthAddr, insecure.NewCredentials())
	for _, svc := range []string{"", "inference-extension", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		testutil.WaitFor(t, "SERVING for "+svc, func() bool { return healthStatus(t, conn, svc) == healthpb.HealthCheckResponse_SERVING })
	}
}

// --secure-serving: the ext_proc port speaks TLS only (a self-signed
// certificate), the health port stays plaintext for the kubelet.
func TestSecureServing(t *testing.T) {
	f := startFleetWith(t, func(o *Options) { o.SecureServing = ToggleOn })
	grpcAddr, healthAddr, _ := f.picker.Addrs()
	var state tls.ConnectionState
	tlsConn := dial(t, grpcAddr, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, VerifyConnection: func(cs tls.ConnectionState) error {
		state = cs
		return nil
	}}))
	testutil.WaitFor(t, "SERVING over TLS", func() bool { return healthStatus(t, tlsConn, "") == healthpb.HealthCheckResponse_SERVING })
	if len(state.PeerCertificates) == 0 || state.PeerCertificates[0].Subject.CommonName != "kvgate-epp" {
		t.Errorf("ext_proc port presented %v", state.PeerCertificates)
	}
	if got := healthStatus(t, dial(t, grpcAddr, insecure.NewCredentials()), ""); got == healthpb.HealthCheckResponse_SERVING {
		t.Error("the TLS port answered plaintext")
	}
	if got := healthStatus(t, dial(t, healthAddr, insecure.NewCredentials()), "inference-extension"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("plaintext health port = %v", got)
	}
}

// --ha-enable-leader-election against the real API server: of two
// pickers, only the Lease holder is ready; both are live; when the leader
// stops, the standby becomes ready.
func TestLeaderElectionReadiness(t *testing.T) {
	env := suite.Env(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	type replica struct {
		conn   *grpc.ClientConn
		cancel context.CancelFunc
		done   chan error
	}
	var rs [2]replica
	for i := range rs {
		o := staticOptions(t)
		o.LeaderElection, o.Kubeconfig, o.PoolName, o.PoolNamespace = true, kubeconfig, "ha-pool", "default"
		p, err := New(o, quiet)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		<-p.Listening()
		_, healthAddr, _ := p.Addrs()
		rs[i] = replica{dial(t, healthAddr, insecure.NewCredentials()), cancel, done}
		t.Cleanup(func() { cancel(); <-done })
	}
	ready := func(i int) bool {
		return healthStatus(t, rs[i].conn, "readiness") == healthpb.HealthCheckResponse_SERVING
	}
	deadline := time.Now().Add(30 * time.Second)
	for !ready(0) && !ready(1) {
		if time.Now().After(deadline) {
			t.Fatal("no replica became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	lead := 0
	if ready(1) {
		lead = 1
	}
	standby := 1 - lead
	for range 5 {
		if ready(standby) {
			t.Fatal("both replicas report ready")
		}
		if healthStatus(t, rs[standby].conn, "liveness") != healthpb.HealthCheckResponse_SERVING {
			t.Fatal("the standby is not live")
		}
		time.Sleep(100 * time.Millisecond)
	}
	rs[lead].cancel()
	if err := <-rs[lead].done; err != nil {
		t.Fatalf("leader exited: %v", err)
	}
	rs[lead].done <- nil // for the cleanup
	// The stopping leader released the Lease: the standby takes over well
	// before a lease duration would have passed without the release.
	deadline = time.Now().Add(30 * time.Second)
	for !ready(standby) {
		if time.Now().After(deadline) {
			t.Fatal("the standby never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
