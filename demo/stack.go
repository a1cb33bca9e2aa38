package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/extproc/epp"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

// Model is the model name the simulators serve and the workload requests.
const Model = "Qwen/Qwen3-0.6B"

// ObjectivesPool is the pool name a fleet with objectives runs as: the
// InferenceObjectives' poolRef.
const ObjectivesPool = "kvgate-up"

// StackConfig describes one fleet.
type StackConfig struct {
	// Bin is the kvgate binary the components run as subcommands of.
	Bin          string
	Wasm         string
	TokenizerDir string
	Replicas     int
	// Policy names the picker configuration (see policies).
	Policy string
	// PickerConfig, when set, is the picker's EndpointPickerConfig instead
	// of Policy's.
	PickerConfig string
	// SimFailureRate is the share of requests the simulators answer with
	// an injected 500.
	SimFailureRate float64
	// FlowControl, when set, runs the policy under the flow-control layer.
	FlowControl *config.PolicyFlowControl
	// Objectives, when set, is an InferenceObjective YAML file (poolRef
	// ObjectivesPool) the picker reads its request priorities from.
	Objectives string
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
	// AgentBin, when set, is a kvgate-agent binary run beside the fleet:
	// its telemetry (GPUs, network) goes to the picker and the report.
	AgentBin string
	// SimArgs and EPPArgs are extra `kvgate sim` and `kvgate epp` flags.
	SimArgs, EPPArgs []string
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
	// Agent is the node agent (nil without StackConfig.AgentBin) and
	// AgentAddr its gRPC address.
	Agent     *proc.Proc
	AgentAddr string
	group     *proc.Group
	others    []*proc.Proc // components beside the sims, picker and gateway (P/D fleets)
}

// StopGrace is how long children get between SIGTERM and SIGKILL; with
// the kill itself it keeps a shutdown under the promised 5 s.
const StopGrace = 3 * time.Second

// ErrNotReady is wrapped when a component does not come up in time.
var ErrNotReady = errors.New("not ready")

// fleetPorts are a fleet's loopback ports, all chosen up front.
type fleetPorts struct {
	kvEvents, grpc, health, metrics, gateway, agent int
	sims                                            []int
}

// newFleetPorts asks the OS for the ports of a fleet of replicas
// simulators. Each listener is held until all are chosen, so the fleet
// never gets the same port twice.
func newFleetPorts(replicas int) (fleetPorts, error) {
	ports, err := freePorts(replicas + 6)
	if err != nil {
		return fleetPorts{}, err
	}
	return fleetPorts{kvEvents: ports[0], grpc: ports[1], health: ports[2], metrics: ports[3], gateway: ports[4], agent: ports[5], sims: ports[6:]}, nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// StartStack starts the fleet and waits until the gateway can route.
func StartStack(ctx context.Context, c StackConfig) (*Stack, error) {
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
	return withFreshPorts(c.Progress, func() (*Stack, error) { return startFleet(ctx, c) })
}

// fleetStarts is how many times a fleet is started, each on newly drawn
// ports, while a component finds one of them taken.
const fleetStarts = 4

// withFreshPorts runs start again, on newly drawn ports, while it fails
// because a component found its port taken. Ports are drawn before the
// components that bind them start, and a concurrent fleet (another test
// package's, with its own draw from the same range) can bind one in
// between; the fleet's own draw never repeats a port.
func withFreshPorts[S any](progress func(string), start func() (S, error)) (S, error) {
	for n := 1; ; n++ {
		s, err := start()
		who := portTakenBy(err)
		if err == nil || n == fleetStarts || who == "" {
			return s, err
		}
		progress(fmt.Sprintf("a port was taken before its component bound it (%v); starting again on new ports", who))
	}
}

// portTakenBy names the component err says died because its listen
// address was in use ("" if err is no such death).
func portTakenBy(err error) string {
	var exit *proc.ExitError
	if !errors.As(err, &exit) {
		return ""
	}
	for _, l := range exit.Tail {
		if strings.Contains(l, "address already in use") {
			return exit.Name
		}
	}
	return ""
}

// startFleet is one start of StartStack's fleet.
func startFleet(ctx context.Context, c StackConfig) (_ *Stack, err error) {
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
	ports, err := newFleetPorts(c.Replicas)
	if err != nil {
		return nil, err
	}
	// Simulators first: the picker drops endpoints whose scrapes fail, so
	// it should find them up. They connect to its KV-event socket, which
	// ZMQ retries until the picker binds it.
	if err := s.startSims(c, ports); err != nil {
		return nil, err
	}
	if err := s.startAgent(c, ports); err != nil {
		return nil, err
	}
	if err := s.startEPP(c, ports); err != nil {
		return nil, err
	}
	if err := s.startGateway(c, ports); err != nil {
		return nil, err
	}
	if err := s.awaitReady(ctx, c, ports); err != nil {
		return nil, err
	}
	return s, nil
}

// simOptions are replica i's `kvgate sim` flags.
func (c StackConfig) simOptions(i int, ports fleetPorts) vllmserver.Options {
	o := vllmserver.DefaultOptions()
	o.Host, o.Port = "127.0.0.1", ports.sims[i]
	o.Model, o.TokenizerDir, o.Preset, o.BlockSize, o.HashSeed = Model, c.TokenizerDir, "qwen3-0.6b-h100", kvhash.DefaultBlockSize, c.HashSeed
	o.NumGPUBlocks, o.TimeScale, o.Seed = c.NumGPUBlocks, c.TimeScale, uint64(i+1)
	o.FailureRate = c.SimFailureRate
	// The picker binds the KV-event socket; the simulators connect to it.
	o.KVEventsEndpoint = "tcp://" + loopback(ports.kvEvents)
	return o
}

// eppOptions are the picker's flags: the fleet's simulators as its static
// endpoints, the policy's configuration inline.
func (c StackConfig) eppOptions(endpointsFile, configText string, ports fleetPorts) epp.Options {
	o := epp.DefaultOptions()
	o.EndpointsFile, o.ConfigText = endpointsFile, configText
	if c.Objectives != "" {
		o.ObjectivesFile, o.PoolName = c.Objectives, ObjectivesPool
	}
	o.GRPCAddr, o.HealthAddr, o.MetricsAddr = loopback(ports.grpc), loopback(ports.health), loopback(ports.metrics)
	o.KVEventsAddr = "tcp://" + loopback(ports.kvEvents)
	o.RefreshMetricsInterval = 50 * time.Millisecond
	// Within the supervisor's grace period, so that shutdown stays clean.
	o.DrainTimeout = 2 * time.Second
	return o
}

// gatewayOptions are the gateway's flags before StackConfig.GatewayArgs.
func (c StackConfig) gatewayOptions(ports fleetPorts) gateway.Options {
	o := gateway.DefaultOptions()
	o.Listen, o.ExtProc, o.WasmPath = loopback(ports.gateway), loopback(ports.grpc), c.Wasm
	o.UpstreamTimeout = 2 * time.Minute
	// The gateway's message timeout also runs while a streamed response
	// waits for the model server's next chunk, so the default 10 s would
	// cut off requests queued that long.
	o.ExtProcTimeout = 30 * time.Second
	if !readsBody(c.Policy) {
		o.RequestBodyMode = "none"
	}
	if c.FailOpen {
		o.FailureModeAllow = true
		fallbacks := make([]string, len(ports.sims))
		for i, p := range ports.sims {
			fallbacks[i] = loopback(p)
		}
		o.Fallback = strings.Join(fallbacks, ",")
	}
	return o
}

func (s *Stack) startSims(c StackConfig, ports fleetPorts) error {
	for i := range c.Replicas {
		o := c.simOptions(i, ports)
		sim := Sim{Name: fmt.Sprintf("sim-%d", i), Addr: loopback(o.Port)}
		args := append(append([]string{"sim"}, o.Args()...), c.SimArgs...)
		p, err := s.group.Start(proc.Spec{Name: sim.Name, Path: c.Bin, Args: args})
		if err != nil {
			return err
		}
		sim.Proc = p
		s.Sims = append(s.Sims, sim)
	}
	return nil
}

func (s *Stack) startEPP(c StackConfig, ports fleetPorts) error {
	specs := make([]endpoints.Spec, len(s.Sims))
	for i, sim := range s.Sims {
		specs[i] = endpoints.Spec{Name: sim.Name, Address: sim.Addr}
	}
	file, err := staticfile.Marshal(specs)
	if err != nil {
		return fmt.Errorf("endpoints file: %w", err)
	}
	epFile := filepath.Join(c.LogDir, "endpoints.yaml")
	if err := os.WriteFile(epFile, file, 0o644); err != nil {
		return fmt.Errorf("endpoints file: %w", err)
	}
	cfg, err := policyConfig(c.Policy, c.TokenizerDir, c.HashSeed, c.FlowControl)
	if err != nil {
		return err
	}
	if c.PickerConfig != "" {
		cfg = c.PickerConfig
	}
	o := c.eppOptions(epFile, cfg, ports)
	if s.AgentAddr != "" {
		o.Telemetry.Agents = []string{s.AgentAddr}
	}
	args := append(append([]string{"epp"}, o.Args()...), c.EPPArgs...)
	if s.EPP, err = s.group.Start(proc.Spec{Name: "epp", Path: c.Bin, Args: args}); err != nil {
		return err
	}
	s.EPPMetricsURL = "http://" + o.MetricsAddr + "/metrics"
	return nil
}

// startAgent runs kvgate-agent as the fleet's node agent: every simulator
// on a GPU of its own (NVML's, where the machine has GPUs), UCX on
// loopback TCP unless the environment says otherwise.
func (s *Stack) startAgent(c StackConfig, ports fleetPorts) error {
	if c.AgentBin == "" {
		return nil
	}
	s.AgentAddr = loopback(ports.agent)
	args := []string{"--listen", s.AgentAddr, "--cpu-bytes", "0", "--node-name", "local", "--node-address", "127.0.0.1"}
	for i, sim := range s.Sims {
		args = append(args, "--gpu-endpoint", fmt.Sprintf("%d=%s", i, sim.Addr))
	}
	var env []string
	for k, v := range map[string]string{"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"} {
		if os.Getenv(k) == "" {
			env = append(env, k+"="+v)
		}
	}
	var err error
	s.Agent, err = s.group.Start(proc.Spec{Name: "agent", Path: c.AgentBin, Args: args, Env: env})
	return err
}

func (s *Stack) startGateway(c StackConfig, ports fleetPorts) (err error) {
	o := c.gatewayOptions(ports)
	args := append(append([]string{"gateway"}, o.Args()...), c.GatewayArgs...)
	if s.Gateway, err = s.group.Start(proc.Spec{Name: "gateway", Path: c.Bin, Args: args}); err != nil {
		return err
	}
	s.GatewayURL = "http://" + o.Listen
	return nil
}

// awaitReady waits, within c.Ready, for each component in start order.
func (s *Stack) awaitReady(ctx context.Context, c StackConfig, ports fleetPorts) error {
	ctx, cancel := context.WithTimeout(ctx, c.Ready)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	for _, sim := range s.Sims {
		if err := s.await(ctx, sim.Name, func(ctx context.Context) error {
			return httpOK(ctx, client, "http://"+sim.Addr+"/health")
		}); err != nil {
			return err
		}
		c.Progress(fmt.Sprintf("%s ready on %s", sim.Name, sim.Addr))
	}
	if s.AgentAddr != "" {
		if err := s.await(ctx, "agent", func(ctx context.Context) error { return grpcServing(ctx, s.AgentAddr) }); err != nil {
			return err
		}
		c.Progress("agent ready on " + s.AgentAddr)
	}
	if err := s.await(ctx, "epp", func(ctx context.Context) error { return grpcServing(ctx, loopback(ports.health)) }); err != nil {
		return err
	}
	c.Progress(fmt.Sprintf("epp ready (policy %s, ext_proc %s)", c.Policy, loopback(ports.grpc)))
	if err := s.await(ctx, "gateway", func(ctx context.Context) error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", loopback(ports.gateway))
		if err == nil {
			conn.Close()
		}
		return err
	}); err != nil {
		return err
	}
	c.Progress("gateway ready on " + s.GatewayURL)
	return nil
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
	for _, p := range append([]*proc.Proc{s.Agent, s.EPP, s.Gateway}, s.others...) {
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

// freePorts finds n distinct free loopback ports. They are drawn at random
// below the kernel's ephemeral range (Linux's default starts at 32768), not
// from it: between choosing a port and the component binding it, the
// ephemeral range is where every outgoing connection on the machine takes
// its local port (UCX, HTTP clients, other tests), and one of them taking
// ours made a component fail with "address already in use". Each port is
// held until all are chosen, so a fleet never gets one twice; another
// fleet's draw can still take one before its component binds it, and then
// withFreshPorts starts the fleet again.
func freePorts(n int) ([]int, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 100*n {
			return nil, fmt.Errorf("free port: no %d free ports in %d..%d", n, minFleetPort, maxFleetPort)
		}
		port := minFleetPort + rand.IntN(maxFleetPort-minFleetPort+1)
		ln, err := net.Listen("tcp", loopback(port))
		if err != nil {
			continue // taken
		}
		lns = append(lns, ln)
		ports = append(ports, port)
	}
	return ports, nil
}

// The range freePorts draws from.
const minFleetPort, maxFleetPort = 20000, 32767
