package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/demo/workload"
	"github.com/kvgate/kvgate/internal/testutil"
)

// The e2e tests run the real kvgate binary's components as processes over
// loopback. TestMain builds the binary and the wasm filter once.
var (
	testBin     string
	testWasm    string
	testTokDir  string
	testTrace   string
	skipReason  string
	repoRootDir string
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		dir, err := os.MkdirTemp("", "kvgate-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if err := setupE2E(dir); err != nil {
			fmt.Fprintln(os.Stderr, "e2e setup:", err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

func setupE2E(dir string) error {
	root, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	repoRootDir = root
	testTokDir = os.Getenv("KVGATE_TOKENIZER_DIR")
	if testTokDir == "" {
		testTokDir = filepath.Join(root, ".cache", "tokenizers", "qwen3")
	}
	testTrace = filepath.Join(root, "..", "shared", "traces", "mooncake_synthetic_trace.jsonl")
	if _, err := os.Stat(filepath.Join(testTokDir, "tokenizer.json")); err != nil {
		skipReason = "tokenizer not installed (make setup): " + err.Error()
		return nil
	}
	if testing.Short() {
		skipReason = "e2e tests start real processes; skipped with -short"
		return nil
	}
	// `make test` has just built bin/ and says so, sparing a second build.
	if bd := os.Getenv("KVGATE_BIN_DIR"); bd != "" {
		testBin, testWasm = filepath.Join(bd, "kvgate"), filepath.Join(bd, "kvgate-filter.wasm")
		if out, err := exec.Command(testBin, "help").CombinedOutput(); err != nil || !hasCommands(string(out), "sim", "gateway", "up", "epp") {
			return fmt.Errorf("KVGATE_BIN_DIR=%s: kvgate lacks a subcommand the tests run (%v):\n%s", bd, err, out)
		}
		_, err := os.Stat(testWasm)
		return err
	}
	testBin, testWasm = filepath.Join(dir, "kvgate"), filepath.Join(dir, "kvgate-filter.wasm")
	if err := goBuild(root, nil, "-o", testBin, "./cmd/kvgate"); err != nil {
		return err
	}
	// P/D fleets run the node agent from beside kvgate.
	if err := goBuild(root, nil, "-o", filepath.Join(dir, "kvgate-agent"), "./cmd/kvgate-agent"); err != nil {
		return err
	}
	return goBuild(root, []string{"GOEXPERIMENT=jsonv2", "GOOS=wasip1", "GOARCH=wasm"}, "-buildmode=c-shared", "-o", testWasm, "./wasm-filter")
}

func hasCommands(help string, names ...string) bool {
	for _, n := range names {
		if !regexp.MustCompile(`(?m)^\s+` + n + `\s`).MatchString(help) {
			return false
		}
	}
	return true
}

func goBuild(root string, env []string, args ...string) error {
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", args, err, out)
	}
	return nil
}

func needE2E(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// startStack starts a fleet that the test's cleanup stops, checking that no
// component outlives it.
func startStack(t *testing.T, c StackConfig) *Stack {
	t.Helper()
	c.Bin, c.Wasm, c.TokenizerDir, c.HashSeed = testBin, testWasm, testTokDir, "42"
	c.LogDir = t.TempDir()
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = 2048
	}
	c.Ready = 30 * time.Second
	s, err := StartStack(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pids := s.PIDs()
		s.Close()
		assertGone(t, pids)
	})
	return s
}

// assertGone fails unless every pid has exited and been reaped.
func assertGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after shutdown (kill 0: %v)", pid, err)
		}
	}
}

// completion sends one request through the gateway with a known request
// id; the id finds the gateway's access-log line naming the endpoint used.
func completion(ctx context.Context, url, id, prompt string, stream bool) (status int, body string, err error) {
	req := map[string]any{"model": Model, "prompt": prompt, "max_tokens": 4, "stream": stream}
	if stream {
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	js, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(js))
	if err != nil {
		return 0, "", err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("x-request-id", id)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

var accessEndpoint = regexp.MustCompile(`endpoint=(\S+)`)

// servedBy reads the endpoint the gateway logged for request id.
func servedBy(t *testing.T, s *Stack, id string) string {
	t.Helper()
	if m := accessEndpoint.FindStringSubmatch(accessLine(t, s, id)); m != nil {
		return m[1]
	}
	return ""
}

// accessLine is the gateway's access-log line for request id. The
// gateway logs once its handler returns, which may be just after the
// client has read the last byte, so the line is waited for.
func accessLine(t *testing.T, s *Stack, id string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(s.Gateway.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, "request_id="+id+" ") {
				return strings.TrimSpace(line)
			}
		}
		if time.Now().After(deadline) {
			return ""
		}
	}
}

// successes reads each simulator's vllm:request_success_total.
func successes(t *testing.T, s *Stack) map[string]float64 {
	t.Helper()
	out := make(map[string]float64)
	for i, c := range readCounters(t.Context(), http.DefaultClient, s.Sims) {
		out[s.Sims[i].Addr] = c.requests
	}
	return out
}

// waitEventsApplied waits until the picker has applied at least n KV
// event batches: the precise scorer sees a cache only once its events
// arrived.
func waitEventsApplied(t *testing.T, s *Stack, n float64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		m, err := scrapeURL(t.Context(), s.EPPMetricsURL)
		if err == nil && m["kvgate_kvevents_batches_total"] >= n {
			return
		}
	}
	t.Fatalf("picker applied fewer than %v KV event batches", n)
}

func scrapeURL(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

func TestE2ERequestsReachTheChosenSim(t *testing.T) {
	needE2E(t)
	s := startStack(t, StackConfig{Replicas: 2, Policy: PolicyPrecise})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			before := successes(t, s)
			id := fmt.Sprintf("e2e-chosen-%v", stream)
			status, body, err := completion(t.Context(), s.GatewayURL, id, "The capital of France is", stream)
			if err != nil || status != http.StatusOK {
				t.Fatalf("status %d, err %v, body %q", status, err, body)
			}
			if stream {
				if _, err := workload.ReadStream(strings.NewReader(body), nil); err != nil {
					t.Fatalf("stream: %v\n%s", err, body)
				}
			} else if !strings.Contains(body, `"text_completion"`) {
				t.Fatalf("body %q", body)
			}
			chosen := servedBy(t, s, id)
			after := successes(t, s)
			for addr, n := range after {
				want := 0.0
				if addr == chosen {
					want = 1
				}
				if got := n - before[addr]; got != want {
					t.Errorf("sim %s answered %v requests, want %v (gateway chose %q)", addr, got, want, chosen)
				}
			}
		})
	}
}

func TestE2ESharedPrefixLandsOnOneSim(t *testing.T) {
	needE2E(t)
	s := startStack(t, StackConfig{Replicas: 3, Policy: PolicyPrecise})
	prefix := strings.Repeat("You are a careful assistant who answers questions about the weather. ", 20)
	var first string
	for i := range 5 {
		id := fmt.Sprintf("e2e-prefix-%d", i)
		status, body, err := completion(t.Context(), s.GatewayURL, id, fmt.Sprintf("%sQuestion %d: is it raining?", prefix, i), false)
		if err != nil || status != http.StatusOK {
			t.Fatalf("request %d: status %d, err %v, body %q", i, status, err, body)
		}
		ep := servedBy(t, s, id)
		if i == 0 {
			first = ep
			waitEventsApplied(t, s, 1)
			continue
		}
		if ep != first {
			t.Fatalf("request %d went to %s; the shared prefix is cached on %s", i, ep, first)
		}
	}
}

func TestE2EKilledSimShiftsTraffic(t *testing.T) {
	needE2E(t)
	s := startStack(t, StackConfig{Replicas: 3, Policy: PolicyRoundRobin, TimeScale: 0.2})
	victim := s.Sims[0]
	type outcome struct {
		id        string
		afterKill bool
		err       error
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		killed   bool
		wg       sync.WaitGroup
	)
	send := func(i int) {
		defer wg.Done()
		id := fmt.Sprintf("e2e-kill-%d", i)
		mu.Lock()
		after := killed
		mu.Unlock()
		status, body, err := completion(t.Context(), s.GatewayURL, id, fmt.Sprintf("Request number %d asks for a short story.", i), true)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("status %d: %s", status, body)
		}
		if err == nil {
			_, err = workload.ReadStream(strings.NewReader(body), nil)
		}
		mu.Lock()
		outcomes = append(outcomes, outcome{id, after, err})
		mu.Unlock()
	}
	for i := range 60 {
		if i == 20 {
			mu.Lock()
			if err := victim.Proc.Kill(); err != nil {
				t.Fatal(err)
			}
			// SIGKILL is asynchronous: until the process is gone, its
			// listening socket still accepts, and a request accepted
			// there is reset mid-flight, as with any crash. "After the
			// kill" starts when the port refuses connections.
			waitRefused(t, victim.Addr)
			killed = true
			mu.Unlock()
		}
		wg.Add(1)
		go send(i)
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	select {
	case p := <-s.Exited():
		if p != victim.Proc {
			t.Errorf("%s reported dead, want %s", p.Name, victim.Name)
		}
	case <-time.After(10 * time.Second):
		t.Error("the killed sim was not reported")
	}
	servedAfter := map[string]int{}
	for _, o := range outcomes {
		ep := servedBy(t, s, o.id)
		switch {
		case o.err != nil && o.afterKill:
			t.Errorf("%s, sent after the kill, failed: %v\n%s", o.id, o.err, accessLine(t, s, o.id))
		case o.err != nil && ep != victim.Addr:
			t.Errorf("%s failed on %s, which is alive: %v\n%s", o.id, ep, o.err, accessLine(t, s, o.id))
		case o.err == nil && o.afterKill:
			servedAfter[ep]++
		}
	}
	if servedAfter[victim.Addr] > 0 || len(servedAfter) != 2 {
		t.Errorf("after the kill, requests went to %v; want only the two live sims", servedAfter)
	}
}

func TestE2EPickerDownFollowsFailureMode(t *testing.T) {
	needE2E(t)
	for _, tc := range []struct {
		failOpen bool
		want     int
	}{{false, http.StatusInternalServerError}, {true, http.StatusOK}} {
		t.Run(fmt.Sprintf("failure_mode_allow=%v", tc.failOpen), func(t *testing.T) {
			s := startStack(t, StackConfig{Replicas: 1, Policy: PolicyLoad, FailOpen: tc.failOpen})
			s.EPP.Stop(StopGrace)
			status, body, err := completion(t.Context(), s.GatewayURL, "e2e-picker-down", "Hello there", false)
			if err != nil {
				t.Fatal(err)
			}
			if status != tc.want {
				t.Fatalf("status %d, want %d: %s", status, tc.want, body)
			}
		})
	}
}

// ownerTag is the environment entry upCommand gives `kvgate up`, which its
// children inherit (and keep if orphaned), so that ownProcesses counts this
// test's processes only: other packages' tests run fleets of the same
// binary at the same time.
func ownerTag(t *testing.T) string {
	return "KVGATE_TEST_OWNER=" + strconv.Itoa(os.Getpid()) + "/" + t.Name()
}

// ownProcesses lists live processes of the test binary that this test
// started: after `kvgate up` exits there must be none.
func ownProcesses(t *testing.T) []int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	var pids []int
	for _, d := range dirs {
		var pid int
		if _, err := fmt.Sscanf(d.Name(), "%d", &pid); err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe")); err != nil || exe != testBin {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if err == nil && slices.Contains(strings.Split(string(env), "\x00"), ownerTag(t)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func upCommand(t *testing.T, args ...string) (*exec.Cmd, *testutil.SyncBuffer) {
	t.Helper()
	if _, err := os.Stat(testTrace); err != nil {
		t.Skipf("trace not available: %v", err)
	}
	out := t.TempDir()
	cmd := exec.Command(testBin, append([]string{"up", "--out", out, "--kvgate", testBin, "--wasm", testWasm,
		"--tokenizer", testTokDir, "--trace", testTrace}, args...)...)
	cmd.Dir = repoRootDir
	cmd.Env = append(os.Environ(), ownerTag(t))
	buf := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = buf, buf
	t.Cleanup(func() {
		if cmd.Process != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, buf
}

func TestE2EUpRunsToCompletion(t *testing.T) {
	needE2E(t)
	// Both policies run headers-only (the body never crosses gRPC). That
	// keeps this test clear of a gateway race on the streamed-body path:
	// the gateway stops its request-body pump when the upstream answers,
	// which can cut the upstream connection before the body's EOF. The
	// precise path has its own tests above.
	cmd, buf := upCommand(t, "--requests", "16", "--replicas", "2", "--duration", "2s", "--time-scale", "0.5", "--policy", "load")
	if err := cmd.Run(); err != nil {
		t.Fatalf("kvgate up: %v\n%s", err, buf)
	}
	out := buf.String()
	for _, want := range []string{"policy", "round-robin", "load", "16/16", "report:", "report.html"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out, "\r") {
		t.Error("progress bar drawn without a terminal")
	}
	dir := cmd.Args[3]
	for _, f := range []string{"report.html", "results.json", "logs/load/epp.log", "logs/round-robin/sim-1.log", "logs/load/gateway.log"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s missing or empty: %v", f, err)
		}
	}
	// With kvgate-agent beside kvgate (make build), each fleet runs one and
	// the report shows what it saw of the GPUs and the network.
	html, _ := os.ReadFile(filepath.Join(dir, "report.html"))
	if !strings.Contains(string(html), "Network and GPUs") {
		t.Error("report.html lacks its network and GPU section")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(testBin), "kvgate-agent")); err == nil {
		if fi, err := os.Stat(filepath.Join(dir, "logs", "load", "agent.log")); err != nil || fi.Size() == 0 {
			t.Errorf("agent.log missing or empty: %v", err)
		}
		if !strings.Contains(string(html), "node local") {
			t.Error("report.html has no telemetry from the fleet's agent")
		}
	}
	if pids := ownProcesses(t); len(pids) > 0 {
		t.Errorf("processes left behind: %v\n%s", pids, out)
	}
	if t.Failed() {
		t.Log(out)
	}
}

// `kvgate up --mixed` runs its three fleets and reports per class: online
// traffic is never shed under flow control, the batch job's requests are
// all accounted for (served or shed), and the objectives reached the
// picker (the batch class is refused when saturated, which only a
// sheddable priority allows).
func TestE2EUpMixed(t *testing.T) {
	needE2E(t)
	cmd, buf := upCommand(t, "--mixed", "--requests", "16", "--replicas", "2", "--duration", "3s", "--time-scale", "0.2",
		"--policy", "load", "--batch-requests", "120", "--batch-max-tokens", "16", "--max-concurrency", "1", "--holdback", "0.1", "--queue-ttl", "1500ms")
	if err := cmd.Run(); err != nil {
		t.Fatalf("kvgate up --mixed: %v\n%s", err, buf)
	}
	out := buf.String()
	for _, want := range []string{"online-only", "mixed-flow-control", "mixed-no-flow-control", "× online alone", "report.html"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	dir := cmd.Args[3]
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Classes []struct {
			Scenario, Class string
			Shed            int
			Summary         struct{ Requests, Errors int }
		}
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Classes) != 5 {
		t.Fatalf("%d classes in results.json, want 5 (online alone; online and batch twice)", len(res.Classes))
	}
	shedUnderFC := 0
	for _, c := range res.Classes {
		switch {
		case c.Class == "online" && c.Scenario != "mixed-no-flow-control" && c.Summary.Errors > 0:
			t.Errorf("%s: %d online requests failed", c.Scenario, c.Summary.Errors)
		case c.Class == "batch" && c.Summary.Errors != c.Shed:
			t.Errorf("%s: %d batch requests failed, %d of them shed: the others are errors", c.Scenario, c.Summary.Errors, c.Shed)
		case c.Class == "batch" && c.Scenario == "mixed-flow-control":
			shedUnderFC = c.Shed
		}
	}
	if shedUnderFC == 0 {
		t.Errorf("no batch request was shed under flow control at --max-concurrency 1, --holdback 0.1: the batch objective did not apply")
	}
	if pids := ownProcesses(t); len(pids) > 0 {
		t.Errorf("processes left behind: %v", pids)
	}
	if t.Failed() {
		t.Log(out)
	}
}

func TestE2EUpStopsOnSIGTERM(t *testing.T) {
	needE2E(t)
	cmd, buf := upCommand(t, "--requests", "4", "--replicas", "1", "--duration", "1s", "--no-compare", "--policy", "round-robin", "--keep-running")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, cond func() bool) {
		for range 600 {
			if cond() {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("never saw %s:\n%s", what, buf)
	}
	waitFor("the fleet up", func() bool { return len(ownProcesses(t)) == 4 && strings.Contains(buf.String(), "Press Ctrl-C") })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, buf)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("kvgate up ignored SIGTERM:\n%s", buf)
	}
	if pids := ownProcesses(t); len(pids) > 0 {
		t.Errorf("processes left behind: %v", pids)
	}
}

// waitRefused waits until nothing accepts connections on addr.
func waitRefused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s still accepts connections 5 s after SIGKILL", addr)
}
