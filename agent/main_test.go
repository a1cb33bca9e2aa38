package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/internal/testutil"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

func TestMainRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ucx-param", "turbo=1", "--listen", "127.0.0.1:0"}, `unknown UCX backend parameter "turbo"`},
		{[]string{"--ucx-param", "num_workers"}, "want key=value"},
		{[]string{"--cpu-bytes", "-1"}, "must not be negative"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--netobs-class", "kv"}, "want name=port"},
		{[]string{"--netobs-class", "a=80", "--netobs-class", "a=81", "--listen", "127.0.0.1:0"}, `flow class "a" given twice`},
		{[]string{"--netobs-max-flows", "1", "--listen", "127.0.0.1:0"}, "MaxFlows"},
		{[]string{"--netobs-dns-ttl", "10ms", "--listen", "127.0.0.1:0"}, "DNS TTL 10ms below 1s"},
		{[]string{"--metrics-addr", "256.0.0.1:1", "--listen", "127.0.0.1:0"}, "--metrics-addr"},
		{[]string{"--gpu", "maybe", "--listen", "127.0.0.1:0"}, `--gpu "maybe"`},
		{[]string{"--gpu-endpoint", "x=1.2.3.4:5"}, "want index=host:port"},
		{[]string{"--gpu-endpoint", "0=vllm-0:8000"}, "want an IP:port or an IP"},
		{[]string{"--node-address", "node-7"}, "node-address"},
		{[]string{"--region-dir", "shm", "--listen", "127.0.0.1:0"}, `region directory "shm" (--region-dir) must be an absolute path`},
		{[]string{"--region-dir", "/no/such/dir", "--listen", "127.0.0.1:0"}, "region directory (--region-dir)"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := Main(context.Background(), tc.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestMainServesTelemetry runs the agent on this GPU-less machine: it
// starts, says once that it runs without NVML, and streams reports that
// say so, beside its metrics.
func TestMainServesTelemetry(t *testing.T) {
	var stdout, stderr testutil.SyncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, []string{"--listen", "127.0.0.1:0", "--cpu-bytes", "0", "--node-name", "node-a",
			"--node-address", "127.0.0.7", "--metrics-addr", "127.0.0.1:0", "--gpu-endpoint", "0=127.0.0.7:8000"}, &stdout, &stderr)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	addr := waitLine(t, &stdout, regexp.MustCompile(`listening on (\S+)`))
	metrics := waitLine(t, &stdout, regexp.MustCompile(`metrics on (\S+)`))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w, err := telemetryv1.NewTelemetryClient(conn).Watch(ctx, &telemetryv1.WatchRequest{IntervalMs: 100})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.Node != "node-a" || len(r.Addresses) != 1 || r.Addresses[0] != "127.0.0.7" || r.GpuAvailable ||
			r.GpuUnavailableReason == "" || len(r.Gpus) != 0 {
			t.Fatalf("report %v", r)
		}
	}
	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check: %v %v", h, err)
	}
	if body := getMetrics(t, metrics); !strings.Contains(body, "kvgate_gpu_nvml_available 0") {
		t.Fatalf("metrics:\n%s", body)
	}
	if n := strings.Count(stderr.String(), "running without NVML"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, stderr.String())
	}
}

// getMetrics reads the agent's /metrics at addr (host:port).
func getMetrics(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func waitLine(t *testing.T, b *testutil.SyncBuffer, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(b.String()); m != nil {
			return m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no line matching %v in %q", re, b.String())
	return ""
}

// TestMainStopsWithWatchers ends Main while a model server's connector
// still watches its releases and the picker its telemetry: those streams
// last as long as their clients do, so a shutdown that waits for every RPC
// to end on its own never ended (the pod was killed at its grace period).
func TestMainStopsWithWatchers(t *testing.T) {
	var stdout testutil.SyncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	dir := t.TempDir()
	go func() {
		done <- Main(ctx, []string{"--listen", "127.0.0.1:0", "--cpu-bytes", "0", "--region-dir", dir}, &stdout, io.Discard)
	}()
	addr := waitLine(t, &stdout, regexp.MustCompile(`listening on (\S+)`))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	n := &node{addr: addr, dir: dir, client: agentv1.NewKVTransferClient(conn)}
	n.region(t, "E", blockBytes, 4, "")
	// The watches outlive Main's context, as their clients do.
	w, err := n.client.WatchReleases(context.WithoutCancel(ctx), &agentv1.WatchReleasesRequest{EngineId: "E"})
	if err != nil {
		t.Fatal(err)
	}
	tw, err := telemetryv1.NewTelemetryClient(conn).Watch(context.WithoutCancel(ctx), &telemetryv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Recv(); err != nil { // the first report comes at once
		t.Fatal(err)
	}
	// The stream is open on the agent once it delivers a release: holds
	// that expire at once are stored until one arrives.
	got := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			select {
			case <-got:
				return
			case <-time.After(20 * time.Millisecond):
			}
			_, _ = n.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "E", Hashes: []uint64{uint64(i)},
				Hold: &agentv1.Hold{RequestId: fmt.Sprint("r", i), LeaseMs: 1}})
		}
	}()
	_, err = w.Recv()
	close(got)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Main did not return with watch streams open")
	}
	if _, err := w.Recv(); err == nil {
		t.Fatal("the release watch is still open after Main returned")
	}
	for {
		if _, err := tw.Recv(); err != nil {
			break // reports sent before the stop may still be queued
		}
	}
}
