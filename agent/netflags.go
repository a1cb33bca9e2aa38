package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/agent/netobs"
)

// classFlag collects repeated --netobs-class name=ports.
type classFlag []netobs.Class

func (c *classFlag) String() string {
	var parts []string
	for _, cl := range *c {
		parts = append(parts, cl.Name)
	}
	return strings.Join(parts, ",")
}

func (c *classFlag) Set(s string) error {
	cl, err := netobs.ParseClass(s)
	if err != nil {
		return err
	}
	*c = append(*c, cl)
	return nil
}

// netFlags are the network-observation and metrics flags.
type netFlags struct {
	metricsAddr string
	enable      bool
	cgroup      string
	classes     classFlag
	maxFlows    int
	maxPeers    int
	interval    time.Duration
	dnsTTL      time.Duration
}

func (n *netFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address (empty: none)")
	fs.BoolVar(&n.enable, "netobs", false, "track TCP RTT, retransmits and bytes acked per peer with eBPF (sockops; needs CAP_BPF and CAP_NET_ADMIN, or root)")
	fs.StringVar(&n.cgroup, "netobs-cgroup", "", "cgroup v2 whose sockets are tracked (default "+netobs.DefaultCgroupPath()+")")
	var defaults []string
	for _, c := range netobs.DefaultClasses() {
		var r []string
		for _, pr := range c.Ranges {
			r = append(r, fmt.Sprintf("%d-%d", pr.Lo, pr.Hi))
		}
		defaults = append(defaults, c.Name+"="+strings.Join(r, ","))
	}
	fs.Var(&n.classes, "netobs-class", "flow class name=port[-port][,...] (repeatable; replaces the defaults "+strings.Join(defaults, " ")+")")
	fs.IntVar(&n.maxFlows, "netobs-max-flows", 16384, "entries of the BPF flow map (LRU)")
	fs.IntVar(&n.maxPeers, "netobs-max-peers", 256, "peer addresses tracked (bounds the peer label)")
	fs.DurationVar(&n.interval, "netobs-interval", time.Second, "how often the flow map is read")
	fs.DurationVar(&n.dnsTTL, "netobs-dns-ttl", 30*time.Second, "how long a peer agent's looked-up address is used before it is looked up again")
}

// tracker builds the network tracker: NIXL transfer timings always, the
// eBPF flows with --netobs. Without eBPF support it says so once and goes
// on without.
func (n *netFlags) tracker(log *slog.Logger) (*netobs.Tracker, error) {
	t, err := netobs.New(netobs.Config{Classes: n.classes, CgroupPath: n.cgroup, MaxFlows: n.maxFlows,
		MaxPeers: n.maxPeers, Interval: n.interval, DNSTTL: n.dnsTTL, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--netobs-*: %w", err)
	}
	if !n.enable {
		return t, nil
	}
	if err := t.Attach(); err != nil {
		if !errors.Is(err, netobs.ErrUnavailable) {
			return nil, err
		}
		log.Warn("running without eBPF network tracking (NIXL transfer timings only)", "err", err)
	}
	return t, nil
}

// serveMetrics serves /metrics until ctx ends.
func serveMetrics(ctx context.Context, addr string, stdout io.Writer, cs ...prometheus.Collector) (func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(cs...)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "kvgate-agent metrics on %s\n", ln.Addr())
	go func() { _ = srv.Serve(ln) }()
	return func() {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}
