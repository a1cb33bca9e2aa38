package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/agent/gpu"
	"github.com/kvgate/kvgate/agent/telemetry"
)

// telemetryFlags are kvgate-agent's telemetry options.
type telemetryFlags struct {
	node          string
	addresses     []netip.Addr
	gpuMode       string
	gpuEndpoints  map[int][]string
	procRoot      string
	metricsListen string
}

func (t *telemetryFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.node, "node-name", os.Getenv("NODE_NAME"), "this node's name in the telemetry stream (default $NODE_NAME, else the host name)")
	fs.Func("node-address", "an IP of this node, by which the picker resolves peers and endpoints to it (repeatable; default: the addresses of the up, non-loopback interfaces)", func(s string) error {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return err
		}
		t.addresses = append(t.addresses, ip.Unmap())
		return nil
	})
	fs.StringVar(&t.gpuMode, "gpu", "auto", "GPU telemetry: auto (NVML when the driver is there, else run without) or off")
	fs.Func("gpu-endpoint", "index=host:port (or index=ip: every port of that IP): a model server on GPU index, for fleets without pods (repeatable)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		i, err := strconv.Atoi(k)
		if !ok || err != nil || i < 0 {
			return fmt.Errorf("want index=host:port, got %q", s)
		}
		if _, err := netip.ParseAddr(v); err != nil {
			if _, err := netip.ParseAddrPort(v); err != nil {
				return fmt.Errorf("--gpu-endpoint %q: want an IP:port or an IP", v)
			}
		}
		t.gpuEndpoints[i] = append(t.gpuEndpoints[i], v)
		return nil
	})
	fs.StringVar(&t.procRoot, "proc-root", "/proc", "the host's /proc, to map GPU processes to pods (empty: no pod mapping)")
	fs.StringVar(&t.metricsListen, "metrics-listen", "", "Prometheus /metrics listen address (empty: none)")
}

// agentTelemetry is what start built; close stops it.
type agentTelemetry struct {
	server      *telemetry.Server
	transfers   *telemetry.TransferTracker
	metricsAddr net.Addr
	close       func()
}

func (t *telemetryFlags) start(ctx context.Context, log *slog.Logger) (*agentTelemetry, error) {
	if t.node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node-name not given and no host name: %w", err)
		}
		t.node = h
	}
	if len(t.addresses) == 0 {
		t.addresses = interfaceAddrs()
	}
	out := &agentTelemetry{transfers: telemetry.NewTransferTracker(0, nil)}
	cfg := telemetry.Config{Node: t.node, Addresses: t.addresses, Peers: []telemetry.PeerSource{out.transfers}, Log: log}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		telemetry.PeerCollector{Source: out.transfers})
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// stops run before wg.Wait (they end the goroutines), closers after.
	stops, closers := []func(){cancel}, []func(){}
	switch t.gpuMode {
	case "off":
	case "auto":
		c, err := gpu.New(gpu.Config{Endpoints: t.gpuEndpoints, ProcRoot: t.procRoot, Log: log})
		if err != nil && !errors.Is(err, gpu.ErrUnavailable) {
			return nil, err
		}
		cfg.GPUs = c
		reg.MustRegister(c)
		wg.Go(func() { c.Run(ctx) })
		closers = append(closers, c.Close)
	default:
		cancel()
		return nil, fmt.Errorf("--gpu %q: want auto or off", t.gpuMode)
	}
	out.close = func() {
		for _, f := range stops {
			f()
		}
		wg.Wait()
		for _, f := range closers {
			f()
		}
	}
	srv, err := telemetry.NewServer(cfg)
	if err != nil {
		out.close()
		return nil, err
	}
	out.server = srv
	if t.metricsListen != "" {
		ln, err := net.Listen("tcp", t.metricsListen)
		if err != nil {
			out.close()
			return nil, fmt.Errorf("--metrics-listen: %w", err)
		}
		hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		out.metricsAddr = ln.Addr()
		wg.Go(func() {
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		})
		stops = append(stops, func() { hs.Close() })
	}
	return out, nil
}

// interfaceAddrs lists the IPs of the up, non-loopback interfaces.
func interfaceAddrs() []netip.Addr {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		as, _ := i.Addrs()
		for _, a := range as {
			if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
				out = append(out, p.Addr().Unmap())
			}
		}
	}
	return out
}
