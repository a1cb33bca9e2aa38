package epp

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/k8s"
	"github.com/kvgate/kvgate/extproc/telemetry"
)

// TelemetryOptions subscribe the picker to the node agents' telemetry
// stream (extproc/telemetry), which the gpu-health plugins and the P/D
// transfer-cost decider read.
type TelemetryOptions struct {
	// Agents are agent gRPC addresses (host:port).
	Agents []string
	// AgentSelector finds the agent DaemonSet's pods in the pool's
	// namespace; they are subscribed to on AgentPort.
	AgentSelector string
	AgentPort     int
	Interval      time.Duration
}

func defaultTelemetryOptions() TelemetryOptions {
	return TelemetryOptions{AgentPort: 7600, Interval: time.Second}
}

func (t *TelemetryOptions) flags(fs *flag.FlagSet) {
	fs.Var(commaList{&t.Agents}, "telemetry-agents", "comma-separated node-agent gRPC addresses (host:port) whose telemetry (GPU health, network) the picker subscribes to")
	fs.StringVar(&t.AgentSelector, "telemetry-agent-selector", t.AgentSelector, "label selector of the node-agent pods (the DaemonSet) in the pool's namespace, subscribed to on --telemetry-agent-port")
	fs.IntVar(&t.AgentPort, "telemetry-agent-port", t.AgentPort, "the node agents' gRPC port, with --telemetry-agent-selector")
	fs.DurationVar(&t.Interval, "telemetry-interval", t.Interval, "how often each agent sends its telemetry")
}

func (t *TelemetryOptions) enabled() bool { return len(t.Agents) > 0 || t.AgentSelector != "" }

func (t *TelemetryOptions) check() error {
	for _, a := range t.Agents {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--telemetry-agents %q: %w", a, err)
		}
	}
	if t.AgentPort < 1 || t.AgentPort > 65535 {
		return fmt.Errorf("--telemetry-agent-port %d: want 1 to 65535", t.AgentPort)
	}
	if t.Interval < 100*time.Millisecond || t.Interval > time.Minute {
		return fmt.Errorf("--telemetry-interval %v: want 100ms to 1m", t.Interval)
	}
	return nil
}

// telemetryStore builds the store and, with a selector, the discovery of
// the agents; both nil when telemetry is off.
func telemetryStore(o Options, log *slog.Logger) (*telemetry.Store, *k8s.Discovery, error) {
	t := o.Telemetry
	if !t.enabled() {
		return nil, nil, nil
	}
	s, err := telemetry.New(telemetry.Config{Agents: t.Agents, Interval: t.Interval, Log: log})
	if err != nil {
		return nil, nil, err
	}
	if t.AgentSelector == "" {
		return s, nil, nil
	}
	d, err := k8s.New(k8s.Options{PoolNamespace: o.PoolNamespace, Kubeconfig: o.Kubeconfig, EndpointSelector: t.AgentSelector,
		TargetPorts: []int{t.AgentPort}, Logger: log.With("discovering", "telemetry agents")})
	if err != nil {
		return nil, nil, fmt.Errorf("--telemetry-agent-selector: %w", err)
	}
	return s, d, nil
}

// runTelemetry subscribes until ctx ends; the agents' discovery feeds the
// store's agent set.
func runTelemetry(ctx context.Context, s *telemetry.Store, d *k8s.Discovery) error {
	if d == nil {
		s.Run(ctx)
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	err := d.Run(ctx, func(specs []endpoints.Spec) error {
		addrs := make([]string, len(specs))
		for i, sp := range specs {
			addrs[i] = sp.Address
		}
		s.SetAgents(addrs)
		return nil
	})
	<-done
	return err
}

// commaList is a flag of comma-separated values; each use appends.
type commaList struct{ vals *[]string }

func (c commaList) String() string {
	if c.vals == nil {
		return ""
	}
	return strings.Join(*c.vals, ",")
}

func (c commaList) Set(v string) error {
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(*c.vals, f) {
			*c.vals = append(*c.vals, f)
		}
	}
	return nil
}
