package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/agent/gpu"
	"github.com/kvgate/kvgate/agent/netobs"
	"github.com/kvgate/kvgate/agent/telemetry"
)

// telemetryFlags are kvgate-agent's telemetry-stream options.
type telemetryFlags struct {
	node         string
	addresses    []netip.Addr
	gpuMode      string
	gpuEndpoints map[int][]string
	procRoot     string
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
}

// agentTelemetry is what start built: the telemetry service, the
// collectors /metrics adds, and close, which stops it.
type agentTelemetry struct {
	server     *telemetry.Server
	collectors []prometheus.Collector
	close      func()
}

// start opens NVML (per --gpu) and builds the telemetry service over it
// and peers.
func (t *telemetryFlags) start(ctx context.Context, log *slog.Logger, peers telemetry.PeerSource) (*agentTelemetry, error) {
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
	cfg := telemetry.Config{Node: t.node, Addresses: t.addresses, Peers: []telemetry.PeerSource{peers}, Log: log}
	out := &agentTelemetry{close: func() {}}
	switch t.gpuMode {
	case "off":
	case "auto":
		c, err := gpu.New(gpu.Config{Endpoints: t.gpuEndpoints, ProcRoot: t.procRoot, Log: log})
		if err != nil && !errors.Is(err, gpu.ErrUnavailable) {
			return nil, err
		}
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { c.Run(ctx) })
		cfg.GPUs = c
		out.collectors = append(out.collectors, c)
		out.close = func() {
			cancel()
			wg.Wait()
			c.Close()
		}
	default:
		return nil, fmt.Errorf("--gpu %q: want auto or off", t.gpuMode)
	}
	srv, err := telemetry.NewServer(cfg)
	if err != nil {
		out.close()
		return nil, err
	}
	out.server = srv
	return out, nil
}

// netobsPeers feeds the network tracker's figures (eBPF TCP flows and the
// NIXL READ timings) to the telemetry stream. For NIXL the READ latency
// stands in for the RTT, as the stream's contract says.
type netobsPeers struct{ t *netobs.Tracker }

func (n netobsPeers) Peers() []telemetry.PeerStats {
	ps := n.t.Peers()
	out := make([]telemetry.PeerStats, len(ps))
	for i, p := range ps {
		out[i] = telemetry.PeerStats{Peer: p.Peer, Class: p.Class, Flows: p.Flows, SRTT: p.SRTT, MinRTT: p.MinRTT,
			Retransmits: p.Retransmits, BytesAcked: p.BytesAcked, ThroughputBytesPerSec: p.ThroughputBytesPerSec, Updated: p.Updated}
		if p.Class == netobs.NIXLClass && p.SRTT == 0 {
			out[i].SRTT = p.TransferLatency
		}
	}
	return out
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
