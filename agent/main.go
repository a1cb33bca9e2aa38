package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/internal/cliflag"
	nixl "github.com/kvgate/kvgate/nixl-cgo"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// paramFlag collects repeated --ucx-param key=value.
type paramFlag nixl.Params

func (p paramFlag) String() string { return fmt.Sprint(map[string]string(p)) }

func (p paramFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	p[k] = v
	return nil
}

// Main is kvgate-agent: the KV-transfer gRPC service until ctx ends.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvgate-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:7600", "gRPC listen address (peers and local servers); port 0 picks one")
	name := fs.String("name", "", "NIXL agent name, unique among peers (default kvgate-agent-<listen address>)")
	regionDir := fs.String("region-dir", DefaultRegionDir, "the only directory whose files model servers may register as KV regions (the shared-memory directory they share with the agent)")
	cpuBytes := fs.Int("cpu-bytes", 1<<30, "CPU tier size in bytes (0: no CPU tier)")
	lease := fs.Duration("lease", 30*time.Second, "how long held blocks wait for their decoder's notification (vLLM kv_lease_duration)")
	pullTimeout := fs.Duration("pull-timeout", 30*time.Second, "bound on a pull that names no timeout")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	ucx := paramFlag{}
	fs.Var(ucx, "ucx-param", "UCX backend parameter key=value (repeatable): "+strings.Join(sortedKeys(nixl.UCXParams()), ", "))
	var nf netFlags
	nf.register(fs)
	tf := telemetryFlags{gpuEndpoints: map[int][]string{}}
	tf.register(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if *cpuBytes < 0 {
		return fmt.Errorf("--cpu-bytes %d must not be negative", *cpuBytes)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	if *name == "" {
		*name = "kvgate-agent-" + ln.Addr().String()
	}
	nt, err := nf.tracker(log)
	if err != nil {
		return err
	}
	nctx, stopNet := context.WithCancel(ctx)
	netDone := make(chan struct{})
	go func() { nt.Run(nctx); close(netDone) }()
	defer func() {
		stopNet()
		<-netDone
		if err := nt.Close(); err != nil {
			log.Warn("detaching eBPF programs", "err", err)
		}
	}()
	tel, err := tf.start(ctx, log, netobsPeers{nt})
	if err != nil {
		return err
	}
	defer tel.close()
	a, err := New(Config{Name: *name, RegionDir: *regionDir, CPUBytes: *cpuBytes, DefaultLease: *lease, PullTimeout: *pullTimeout,
		UCX: nixl.Params(ucx), Logger: log, Transfers: nt})
	if err != nil {
		return err
	}
	defer a.Close()
	if nf.metricsAddr != "" {
		stop, err := serveMetrics(ctx, nf.metricsAddr, stdout, append([]prometheus.Collector{nt}, tel.collectors...)...)
		if err != nil {
			return err
		}
		defer stop()
	}
	srv := grpc.NewServer()
	agentv1.RegisterKVTransferServer(srv, a)
	telemetryv1.RegisterTelemetryServer(srv, tel.server)
	// The DaemonSet's readiness probe (gRPC health, service "").
	healthpb.RegisterHealthServer(srv, health.NewServer())
	fmt.Fprintf(stdout, "kvgate-agent %s listening on %s\n", *name, ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		// The watch streams end only when told: GracefulStop waits for them.
		a.EndWatches()
		tel.server.Stop()
		srv.GracefulStop()
		<-done
		return nil
	case err := <-done:
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
