package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/demo/proc"
	"github.com/kvgate/kvgate/internal/kvhash"
)

// Model is the model name the simulators serve and the workload requests.
const Model = "Qwen/Qwen3-0.6B"

// StackConfig describes one fleet.
type StackConfig struct {
	// Bin is the kvgate binary the components run as subcommands of.
	Bin          string
	Wasm         string
	TokenizerDir string
	Replicas     int
	// Policy names the picker configuration (see policies).
	Policy string
	// LogDir receives one log file per component.
	LogDir       string
	TimeScale    float64
	NumGPUBlocks int
	HashSeed     string
	// FailOpen sets the gateway's failure_mode_allow, with the simulators
	// as its fallback endpoints.
	FailOpen bool
	// GatewayArgs are extra `kvgate gateway` flags.
	GatewayArgs []string
	// Ready bounds the wait for the fleet to come up.
	Ready time.Duration
	// Progress, if set, receives one line per milestone.
	Progress func(string)
}

// Sim is one running simulator.
type Sim struct {
	Name string
	Addr string // host:port
	Proc *proc.Proc
}

// Stack is a running fleet. Its children die with it: Close, the parent's
// exit (Pdeathsig), or a terminal's Ctrl-C reaching the process group.
type Stack struct {
	Sims       []Sim
	EPP        *proc.Proc
	Gateway    *proc.Proc
	GatewayURL string
	// EPPMetricsURL is the picker's Prometheus endpoint.
	EPPMetricsURL string
	group         *proc.Group
}

// StopGrace is how long children get between SIGTERM and SIGKILL; with
// the kill itself it keeps a shutdown under the promised 5 s.
const StopGrace = 3 * time.Second

// ErrNotReady is wrapped when a component does not come up in time.
var ErrNotReady = errors.New("not ready")

// StartStack starts the fleet and waits until the gateway can route.
func StartStack(ctx context.Context, c StackConfig) (_ *Stack, err error) {
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
	g, err := proc.NewGroup(c.LogDir)
	if err != nil {
		return nil, err
	}
	s := &Stack{group: g}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	// Ports are chosen by the OS: each listener is held until all are
	// chosen, so the fleet never gets the same port twice.
	ports, err := freePorts(c.Replicas + 5)
	if err != nil {
		return nil, err
	}
	kvPort, grpcPort, healthPort, metricsPort, gwPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	addr := func(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }

	// The picker binds the KV-event socket; the simulators connect to it.
	var endpoints strings.Builder
	endpoints.WriteString("endpoints:\n")
	for i := range c.Replicas {
		s.Sims = append(s.Sims, Sim{Name: fmt.Sprintf("sim-%d", i), Addr: addr(ports[5+i])})
		fmt.Fprintf(&endpoints, "- name: sim-%d\n  address: %s\n", i, addr(ports[5+i]))
	}
	epFile := filepath.Join(c.LogDir, "endpoints.yaml")
	if err := os.WriteFile(epFile, []byte(endpoints.String()), 0o644); err != nil {
		return nil, fmt.Errorf("endpoints file: %w", err)
	}
	cfg, err := policyConfig(c.Policy, c.TokenizerDir, c.HashSeed)
	if err != nil {
		return nil, err
	}
	// Simulators first: the picker drops endpoints whose scrapes fail, so
	// it should find them up. They connect to its KV-event socket, which
	// ZMQ retries until the picker binds it.
	for i := range s.Sims {
		sim := &s.Sims[i]
		_, port, _ := net.SplitHostPort(sim.Addr)
		if sim.Proc, err = g.Start(proc.Spec{Name: sim.Name, Path: c.Bin, Args: []string{"sim",
			"--host", "127.0.0.1", "--port", port, "--model", Model, "--tokenizer", c.TokenizerDir,
			"--preset", "qwen3-0.6b-h100", "--block-size", strconv.Itoa(kvhash.DefaultBlockSize), "--hash-seed", c.HashSeed,
			"--num-gpu-blocks", strconv.Itoa(c.NumGPUBlocks), "--time-scale", strconv.FormatFloat(c.TimeScale, 'g', -1, 64),
			"--seed", strconv.Itoa(i + 1), "--kv-events-endpoint", "tcp://" + addr(kvPort),
		}}); err != nil {
			return nil, err
		}
	}
	if s.EPP, err = g.Start(proc.Spec{Name: "epp", Path: c.Bin, Args: []string{"epp",
		"--endpoints", epFile, "--config-text", cfg,
		"--grpc-addr", addr(grpcPort), "--health-addr", addr(healthPort), "--metrics-addr", addr(metricsPort),
		"--kv-events-addr", "tcp://" + addr(kvPort), "--refresh-metrics-interval", "50ms",
		// Within the supervisor's grace period, so that shutdown stays clean.
		"--drain-timeout", "2s",
	}}); err != nil {
		return nil, err
	}
	s.EPPMetricsURL = "http://" + addr(metricsPort) + "/metrics"
	gwArgs := []string{"gateway", "--listen", addr(gwPort), "--extproc", addr(grpcPort),
		"--wasm", c.Wasm, "--upstream-timeout", "2m",
		// The gateway's message timeout also runs while a streamed
		// response waits for the model server's next chunk, so the
		// default 10 s would cut off requests queued that long.
		"--extproc-timeout", "30s"}
	if !readsBody(c.Policy) {
		gwArgs = append(gwArgs, "--request-body-mode", "none")
	}
	if c.FailOpen {
		fallbacks := make([]string, len(s.Sims))
		for i, sim := range s.Sims {
			fallbacks[i] = sim.Addr
		}
		gwArgs = append(gwArgs, "--failure-mode-allow", "--fallback-endpoint", strings.Join(fallbacks, ","))
	}
	gwArgs = append(gwArgs, c.GatewayArgs...)
	if s.Gateway, err = g.Start(proc.Spec{Name: "gateway", Path: c.Bin, Args: gwArgs}); err != nil {
		return nil, err
	}
	s.GatewayURL = "http://" + addr(gwPort)

	ctx, cancel := context.WithTimeout(ctx, c.Ready)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	for _, sim := range s.Sims {
		if err := s.await(ctx, sim.Name, func(ctx context.Context) error {
			return httpOK(ctx, client, "http://"+sim.Addr+"/health")
		}); err != nil {
			return nil, err
		}
		c.Progress(fmt.Sprintf("%s ready on %s", sim.Name, sim.Addr))
	}
	if err := s.await(ctx, "epp", func(ctx context.Context) error { return grpcServing(ctx, addr(healthPort)) }); err != nil {
		return nil, err
	}
	c.Progress(fmt.Sprintf("epp ready (policy %s, ext_proc %s)", c.Policy, addr(grpcPort)))
	if err := s.await(ctx, "gateway", func(ctx context.Context) error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr(gwPort))
		if err == nil {
			conn.Close()
		}
		return err
	}); err != nil {
		return nil, err
	}
	c.Progress("gateway ready on " + s.GatewayURL)
	return s, nil
}

// await polls check until it succeeds, a component dies, or ctx ends.
func (s *Stack) await(ctx context.Context, name string, check func(context.Context) error) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case p := <-s.group.Exited():
			if ctx.Err() != nil { // stopping: children exit on the same signal
				return ctx.Err()
			}
			return p.AsError()
		case <-ctx.Done():
			return fmt.Errorf("%s %w: %w (last check: %w)", name, ErrNotReady, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// Exited delivers components that died on their own.
func (s *Stack) Exited() <-chan *proc.Proc { return s.group.Exited() }

// PIDs are the process ids of every component.
func (s *Stack) PIDs() []int {
	var pids []int
	for _, p := range s.procs() {
		pids = append(pids, p.PID())
	}
	return pids
}

func (s *Stack) procs() []*proc.Proc {
	var ps []*proc.Proc
	for _, sim := range s.Sims {
		if sim.Proc != nil {
			ps = append(ps, sim.Proc)
		}
	}
	for _, p := range []*proc.Proc{s.EPP, s.Gateway} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// Close stops every component and waits for them to exit.
func (s *Stack) Close() { s.group.StopAll(StopGrace) }

func httpOK(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	return nil
}

func grpcServing(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health %s", resp.Status)
	}
	return nil
}

// freePorts asks the OS for n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		lns = append(lns, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}
