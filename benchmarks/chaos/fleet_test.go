package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/extproc/epp"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

const model = "Qwen/Qwen3-0.6B"

// fleet is the run's processes; every one is killed when the test ends.
type fleet struct {
	t       *testing.T
	bin     string
	dir     string
	at      placement
	client  *http.Client // reaches the gateway and the picker's metrics
	sims    []*process
	simAddr []string
	picker  *process
	gateway *process
	eppArgs []string
	// addresses
	grpc, metrics, gwURL string
}

type process struct {
	name string
	cmd  *exec.Cmd
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// placement says where a fleet runs: the simulators in network namespace
// simNS on simHost, the picker and the gateway in frontNS on frontHost
// ("" is the test's own namespace), and how the test reaches the front
// (dial; nil dials directly).
type placement struct {
	simNS, simHost     string
	frontNS, frontHost string
	dial               func(ctx context.Context, network, addr string) (net.Conn, error)
}

// onLoopback is the plain fleet: everything on 127.0.0.1 here.
var onLoopback = placement{simHost: "127.0.0.1", frontHost: "127.0.0.1"}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

func (f *fleet) start(name string, args ...string) *process {
	f.t.Helper()
	ns := f.at.frontNS
	if strings.HasPrefix(name, "sim") {
		ns = f.at.simNS
	}
	return f.startIn(ns, name, args...)
}

// startIn runs the kvgate binary with args inside network namespace ns
// ("" is this one): `ip netns exec` execs it, so the pid is kvgate's.
func (f *fleet) startIn(ns, name string, args ...string) *process {
	f.t.Helper()
	log, err := os.OpenFile(filepath.Join(f.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	cmd := exec.Command(f.bin, args...)
	if ns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, f.bin}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if lim := os.Getenv("KVGATE_CHAOS_GOMEMLIMIT"); lim != "" && !strings.HasPrefix(name, "sim") {
		cmd.Env = append(os.Environ(), "GOMEMLIMIT="+lim)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	p := &process{name: name, cmd: cmd}
	f.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = log.Close() })
	return p
}

func startFleet(t *testing.T, bin, wasm, tokDir string, replicas int) *fleet {
	return startFleetAt(t, bin, wasm, tokDir, replicas, onLoopback)
}

// startFleetAt starts replicas simulators, the picker and the gateway
// (failing open to the simulators) where at says. Ports are chosen free
// here; the namespaces a placement names are fresh, so they are free
// there too.
func startFleetAt(t *testing.T, bin, wasm, tokDir string, replicas int, at placement) *fleet {
	f := &fleet{t: t, bin: bin, dir: t.TempDir(), at: at,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: at.dial}}}
	front := func() string { return hostPort(at.frontHost, freePort(t)) }
	kv := front()
	var specs []endpoints.Spec
	for i := range replicas {
		o := vllmserver.DefaultOptions()
		o.Host, o.Port = at.simHost, freePort(t)
		o.Model, o.TokenizerDir, o.Preset, o.BlockSize, o.HashSeed = model, tokDir, "qwen3-0.6b-h100", kvhash.DefaultBlockSize, "42"
		o.NumGPUBlocks, o.TimeScale, o.Seed = 2048, 4, uint64(i+1)
		o.KVEventsEndpoint = "tcp://" + kv
		name := fmt.Sprintf("sim-%d", i)
		f.sims = append(f.sims, f.start(name, append([]string{"sim"}, o.Args()...)...))
		addr := hostPort(at.simHost, o.Port)
		f.simAddr = append(f.simAddr, addr)
		specs = append(specs, endpoints.Spec{Name: name, Address: addr})
	}
	if at.simNS == at.frontNS { // otherwise the picker's first scrapes tell
		for _, a := range f.simAddr {
			f.waitHTTP("http://" + a + "/health")
		}
	}
	file, err := staticfile.Marshal(specs)
	if err != nil {
		t.Fatal(err)
	}
	epFile := filepath.Join(f.dir, "endpoints.yaml")
	if err := os.WriteFile(epFile, file, 0o644); err != nil {
		t.Fatal(err)
	}
	eo := epp.DefaultOptions()
	eo.EndpointsFile = epFile
	eo.GRPCAddr, eo.HealthAddr, eo.MetricsAddr = front(), front(), front()
	eo.KVEventsAddr = "tcp://" + kv
	eo.DrainTimeout = time.Second
	f.grpc, f.metrics = eo.GRPCAddr, "http://"+eo.MetricsAddr+"/metrics"
	f.eppArgs = append([]string{"epp"}, eo.Args()...)
	f.picker = f.start("epp", f.eppArgs...)
	f.waitHTTP(f.metrics)

	g := gateway.DefaultOptions()
	g.Listen, g.ExtProc, g.WasmPath = front(), eo.GRPCAddr, wasm
	g.FailureModeAllow, g.Fallback = true, strings.Join(f.simAddr, ",")
	g.ExtProcTimeout = 2 * time.Second
	f.gwURL = "http://" + g.Listen
	f.gateway = f.start("gateway", append([]string{"gateway"}, g.Args()...)...)
	waitFor(t, "the gateway to route", 30*time.Second, func() bool { return f.complete(context.Background(), "hello") == 200 })
	return f
}

// restartPicker starts a new picker with the same flags.
func (f *fleet) restartPicker() { f.picker = f.start("epp", f.eppArgs...) }

func (f *fleet) waitHTTP(url string) {
	f.t.Helper()
	waitFor(f.t, url, 30*time.Second, func() bool {
		resp, err := f.client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode < 500
	})
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// complete sends one small completion through the gateway; 0 on a
// transport error.
func (f *fleet) complete(ctx context.Context, prompt string) int {
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4}`, model, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.gwURL+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("content-type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// rssMiB reads a process's resident set size.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return -1
}

// peakRSS samples pid's RSS every 50 ms until stop closes.
func peakRSS(pid int, stop <-chan struct{}) <-chan float64 {
	out := make(chan float64, 1)
	go func() {
		peak := 0.0
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			peak = max(peak, rssMiB(pid))
			select {
			case <-stop:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// metric reads one unlabelled-or-summed series from the picker's
// Prometheus page.
func (f *fleet) metric(name string) float64 {
	resp, err := f.client.Get(f.metrics)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}
