package batch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/demo"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/testutil/redistest"
)

// The end-to-end tests run the built binary: two `kvgate sim` (echo mode,
// so a response names its request), `kvgate epp`, `kvgate gateway` and
// `kvgate batch`, driven by the official OpenAI SDK (scripts/setup-openai-sdk.sh).

type e2eEnv struct {
	bin, wasm, tokDir, sdk, nodePath string
}

// needE2E returns the environment, or skips: with -short, or when the
// binaries, the tokenizer, node or the SDK are missing (a failure under
// KVGATE_REQUIRE_OPENAI_SDK=1, as `make test` sets after setup).
func needE2E(t *testing.T) e2eEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: starts processes")
	}
	root := testutil.RepoRoot(t)
	skip := func(why string) {
		if os.Getenv("KVGATE_REQUIRE_OPENAI_SDK") == "1" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	e := e2eEnv{tokDir: os.Getenv("KVGATE_TOKENIZER_DIR"), sdk: filepath.Join(root, "batch", "testdata", "sdk.cjs"),
		nodePath: filepath.Join(root, ".cache", "npm-openai", "node_modules")}
	if e.tokDir == "" {
		e.tokDir = filepath.Join(root, ".cache", "tokenizers", "qwen3")
	}
	if _, err := os.Stat(filepath.Join(e.tokDir, "tokenizer.json")); err != nil {
		skip("tokenizer not installed (make setup)")
	}
	if _, err := exec.LookPath("node"); err != nil {
		skip("node not installed (make setup)")
	}
	if _, err := os.Stat(filepath.Join(e.nodePath, "openai", "package.json")); err != nil {
		skip("OpenAI SDK not installed (bash scripts/setup-openai-sdk.sh)")
	}
	bd := os.Getenv("KVGATE_BIN_DIR")
	if bd == "" {
		buildOnce.Do(func() { builtDir, buildErr = buildBinaries(root) })
		if buildErr != nil {
			t.Fatal(buildErr)
		}
		bd = builtDir
	}
	e.bin, e.wasm = filepath.Join(bd, "kvgate"), filepath.Join(bd, "kvgate-filter.wasm")
	if out, err := exec.Command(e.bin, "help").CombinedOutput(); err != nil || !strings.Contains(string(out), "  batch ") {
		t.Fatalf("%s lacks `batch` (rebuild bin/): %v\n%s", e.bin, err, out)
	}
	return e
}

// Without KVGATE_BIN_DIR the tests build the binary and the filter once,
// into a directory TestMain removes.
var (
	buildOnce sync.Once
	builtDir  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

func buildBinaries(root string) (string, error) {
	dir, err := os.MkdirTemp("", "kvgate-batch-e2e-")
	if err != nil {
		return "", err
	}
	for _, b := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"-o", filepath.Join(dir, "kvgate"), "./cmd/kvgate"}},
		{[]string{"GOEXPERIMENT=jsonv2", "GOOS=wasip1", "GOARCH=wasm"}, []string{"-buildmode=c-shared", "-o", filepath.Join(dir, "kvgate-filter.wasm"), "./wasm-filter"}},
	} {
		cmd := exec.Command("go", append([]string{"build"}, b.args...)...)
		cmd.Dir, cmd.Env = root, append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %v: %w\n%s", b.args, err, out)
		}
	}
	return dir, nil
}

// startFleet starts 2 echoing simulators behind the picker and gateway.
// The picker knows InferenceObjective "batch" with a sheddable priority.
func startFleet(t *testing.T, e e2eEnv) *demo.Stack {
	t.Helper()
	dir := t.TempDir()
	objectives := filepath.Join(dir, "objectives.yaml")
	if err := os.WriteFile(objectives, []byte(`apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec:
  priority: -1
  poolRef: {name: kvgate}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := demo.StartStack(t.Context(), demo.StackConfig{
		Bin: e.bin, Wasm: e.wasm, TokenizerDir: e.tokDir, Replicas: 2, Policy: demo.PolicyLoad,
		LogDir: dir, TimeScale: 1, NumGPUBlocks: 4096, HashSeed: "42", Ready: 30 * time.Second,
		SimArgs: []string{"--echo"}, EPPArgs: []string{"--objectives", objectives},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// batchProc is a `kvgate batch` child that the test may kill and restart.
// Each start binds port 0 and the test reads the address from its log,
// so no port is chosen, freed and raced for; the SDK talks to a front
// the test holds for the whole run, which forwards to the current child,
// as a Service address outlives the pod behind it.
type batchProc struct {
	t     *testing.T
	e     e2eEnv
	args  []string
	url   string
	log   *os.File
	cmd   *exec.Cmd
	front *forwarder
}

func startBatch(t *testing.T, e e2eEnv, o Options) *batchProc {
	t.Helper()
	o.Listen = "127.0.0.1:0"
	log, err := os.Create(filepath.Join(t.TempDir(), "batch.log"))
	if err != nil {
		t.Fatal(err)
	}
	front := newForwarder(t)
	p := &batchProc{t: t, e: e, args: append([]string{"batch"}, o.Args()...), url: "http://" + front.addr() + "/v1", log: log, front: front}
	p.start()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM)
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("kvgate batch log:\n%s", tail(string(out), 40))
		}
		log.Close()
	})
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// batchListening is `kvgate batch`'s line naming the address it bound.
var batchListening = regexp.MustCompile(`msg="batch listening" addr=(\S+)`)

func (p *batchProc) start() {
	p.t.Helper()
	from, err := p.log.Seek(0, io.SeekEnd)
	if err != nil {
		p.t.Fatal(err)
	}
	p.cmd = exec.Command(p.e.bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	var addr string
	testutil.WaitFor(p.t, "kvgate batch's listening line", func() bool {
		out, _ := os.ReadFile(p.log.Name())
		if m := batchListening.FindSubmatch(out[min(int(from), len(out)):]); m != nil {
			addr = string(m[1])
		}
		return addr != ""
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
			p.front.to(addr)
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("kvgate batch not up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// forwarder is a loopback TCP front that hands each connection to the
// current backend; with none (or one that refuses), it closes the
// connection, which a client sees as the server being down.
type forwarder struct {
	ln      net.Listener
	mu      sync.Mutex
	backend string
}

func newForwarder(t *testing.T) *forwarder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { f.serve(c) })
		}
	})
	return f
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

func (f *forwarder) to(backend string) {
	f.mu.Lock()
	f.backend = backend
	f.mu.Unlock()
}

func (f *forwarder) serve(c net.Conn) {
	defer c.Close()
	f.mu.Lock()
	backend := f.backend
	f.mu.Unlock()
	if backend == "" {
		return
	}
	b, err := net.Dial("tcp", backend)
	if err != nil {
		return
	}
	defer b.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Either side ending ends both: a killed child drops its client.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(b, c)
	go pipe(c, b)
	<-done
	<-done
}

func (p *batchProc) stop(sig syscall.Signal) {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	_ = p.cmd.Wait()
	p.cmd = nil
}

// counts reads a batch's request counts through the API.
func (p *batchProc) counts(id string) (RequestCounts, string, error) {
	req, _ := http.NewRequest(http.MethodGet, p.url+"/batches/"+id, nil)
	req.Header.Set("X-MaaS-Username", "tenant-e2e")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return RequestCounts{}, "", err
	}
	defer resp.Body.Close()
	var b Batch
	err = json.NewDecoder(resp.Body).Decode(&b)
	return b.RequestCounts, b.Status, err
}

// writeInput writes n chat lines; line i's prompt names its custom_id,
// which the echoing simulator answers with.
func writeInput(t *testing.T, n int) string {
	t.Helper()
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"line req-%d"}]}}`+"\n", i, demo.Model, i)
	}
	path := filepath.Join(t.TempDir(), "input.jsonl")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// sdkRun starts the SDK driver; wait returns its outcome directory.
func sdkRun(t *testing.T, ctx context.Context, e e2eEnv, p *batchProc, input, window, mode string, cancelAfter int) (out string, wait func() error) {
	out = t.TempDir()
	cmd := exec.CommandContext(ctx, "node", e.sdk, mode, p.url, input, out, window, strconv.Itoa(cancelAfter))
	cmd.Env = append(os.Environ(), "NODE_PATH="+e.nodePath)
	var stderr testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return out, func() error {
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("sdk driver: %w\n%s", err, stderr.String())
		}
		return nil
	}
}

type result struct {
	ok   bool
	line outputLine
}

// readResults reads the output and error files, failing on a custom_id
// seen twice.
func readResults(t *testing.T, out string) map[string]result {
	t.Helper()
	got := map[string]result{}
	for _, name := range []string{"output.jsonl", "error.jsonl"} {
		f, err := os.Open(filepath.Join(out, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l outputLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatalf("%s: %v: %s", name, err, sc.Bytes())
			}
			if _, dup := got[l.CustomID]; dup {
				t.Errorf("custom_id %s twice in the results", l.CustomID)
			}
			got[l.CustomID] = result{ok: name == "output.jsonl", line: l}
		}
		f.Close()
	}
	return got
}

// checkEcho checks that a successful line answers its own request.
func checkEcho(t *testing.T, id string, l outputLine) {
	t.Helper()
	if l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil {
		t.Errorf("%s: not a success: %+v", id, l)
		return
	}
	var body struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(l.Response.Body, &body); err != nil || len(body.Choices) != 1 {
		t.Errorf("%s: body %s: %v", id, l.Response.Body, err)
		return
	}
	if want := "line " + id; body.Choices[0].Message.Content != want {
		t.Errorf("%s: answer %q, want %q", id, body.Choices[0].Message.Content, want)
	}
}

func readBatch(t *testing.T, out string) (Batch, []string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(out, "batch.json"))
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	st, _ := os.ReadFile(filepath.Join(out, "statuses"))
	return b, strings.Fields(string(st))
}

// TestE2E runs each end-to-end scenario against one fleet, with the
// embedded store and with a real Redis.
func TestE2E(t *testing.T) {
	e := needE2E(t)
	fleet := startFleet(t, e)
	scenarios := []struct {
		name string
		fn   func(t *testing.T, e e2eEnv, o Options)
	}{
		{"job", sdkJob}, {"kill-loop", killLoop}, {"cancel-expiry", cancelAndExpiry},
	}
	for _, mode := range []string{"embedded", "redis"} {
		t.Run(mode, func(t *testing.T) {
			redisURL := ""
			if mode == "redis" {
				redisURL = "redis://" + redistest.Start(t).Addr + "/0"
			}
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					o := DefaultOptions()
					o.Gateway, o.DataDir, o.RedisURL = fleet.GatewayURL, t.TempDir(), redisURL
					o.RetryBase, o.RetryMax, o.LeaseTTL = 20*time.Millisecond, 500*time.Millisecond, 600*time.Millisecond
					sc.fn(t, e, o)
				})
			}
		})
	}
}

// sdkJob: 1,000 lines, every output its own request's answer.
func sdkJob(t *testing.T, e e2eEnv, o Options) {
	p := startBatch(t, e, o)
	const n = 1000
	out, wait := sdkRun(t, t.Context(), e, p, writeInput(t, n), "24h", "run", 0)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	checkCompleted(t, out, n, "")
	// The batch's status is final before the jobs counter moves: the
	// client may have seen it first, so the page is read until it has the
	// count (or the deadline passes).
	wants := []string{`jobs_processed_total{result="completed"} 1`, "processor_inflight_requests 0",
		`model_request_execution_duration_seconds_count{model="` + demo.Model + `"}`}
	var metrics string
	testutil.WaitFor(t, wants[0], func() bool {
		resp, err := http.Get(strings.TrimSuffix(p.url, "/v1") + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		metrics = string(b)
		return strings.Contains(metrics, wants[0])
	})
	for _, want := range wants {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// checkCompleted checks a completed n-line batch: the object, and every
// line answered once, by its own request's answer.
func checkCompleted(t *testing.T, out string, n int, what string) {
	t.Helper()
	b, statuses := readBatch(t, out)
	if b.Status != StatusCompleted || b.RequestCounts != (RequestCounts{Total: int64(n), Completed: int64(n)}) {
		t.Fatalf("%sbatch %s %+v (statuses %v)", what, b.Status, b.RequestCounts, statuses)
	}
	if b.CompletedAt == nil || b.InProgressAt == nil || b.FinalizingAt == nil || b.ErrorFileID != nil || b.Model == nil || *b.Model != demo.Model {
		t.Errorf("batch object %+v", b)
	}
	if b.Metadata["suite"] != "kvgate-e2e" || b.Usage.InputTokens == 0 || b.Usage.OutputTokens == 0 ||
		b.Usage.TotalTokens != b.Usage.InputTokens+b.Usage.OutputTokens {
		t.Errorf("metadata %v usage %+v", b.Metadata, b.Usage)
	}
	got := readResults(t, out)
	if len(got) != n {
		t.Fatalf("%s%d results for %d lines", what, len(got), n)
	}
	for i := range n {
		id := fmt.Sprintf("req-%d", i)
		checkEcho(t, id, got[id].line)
	}
}

// killLoop kills `kvgate batch` with SIGKILL at least 5 times during one
// job; each restart resumes it, and every line ends in the results exactly
// once.
func killLoop(t *testing.T, e e2eEnv, o Options) {
	// A slow job, so that it spans the kills.
	o.MaxConcurrency, o.MaxModelConcurrency = 4, 4
	p := startBatch(t, e, o)
	const n, kills = 1000, 6
	out, wait := sdkRun(t, t.Context(), e, p, writeInput(t, n), "24h", "run", 0)
	idFile := filepath.Join(out, "batch_id")
	var id string
	for id == "" {
		raw, _ := os.ReadFile(idFile)
		id = string(raw)
		time.Sleep(20 * time.Millisecond)
	}
	// Kill whenever the job has made progress since the last kill,
	// spreading the kills over the job.
	killed, last := 0, int64(0)
	for killed < kills {
		c, status, err := p.counts(id)
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if final(status) {
			t.Fatalf("the job ended (%s) after %d kills; it should outlast %d", status, killed, kills)
		}
		if done := c.Completed + c.Failed; done >= last+n/(kills+2) {
			p.stop(syscall.SIGKILL)
			killed++
			last = done
			p.start()
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	checkCompleted(t, out, n, fmt.Sprintf("after %d kills: ", killed))
}

// cancelAndExpiry: a cancelled batch keeps what finished and gives every
// other line batch_cancelled; a batch past its completion_window gives its
// unfinished lines batch_expired. Either way each custom_id is in the
// output or the error file exactly once.
func cancelAndExpiry(t *testing.T, e e2eEnv, o Options) {
	o.MaxConcurrency, o.MaxModelConcurrency = 2, 2
	p := startBatch(t, e, o)
	const n = 400
	for _, tc := range []struct {
		mode, window, status, code string
		cancelAfter                int
	}{
		{"cancel", "24h", StatusCancelled, CodeCancelled, 20},
		{"run", "2s", StatusExpired, CodeExpired, 0},
	} {
		out, wait := sdkRun(t, t.Context(), e, p, writeInput(t, n), tc.window, tc.mode, tc.cancelAfter)
		if err := wait(); err != nil {
			t.Fatal(err)
		}
		b, statuses := readBatch(t, out)
		if b.Status != tc.status {
			t.Fatalf("%s: status %s (%v)", tc.mode, b.Status, statuses)
		}
		c := b.RequestCounts
		if c.Total != n || c.Completed+c.Failed != n || c.Completed == 0 || c.Failed == 0 {
			t.Errorf("%s: counts %+v", tc.mode, c)
		}
		switch tc.status {
		case StatusCancelled:
			if b.CancellingAt == nil || b.CancelledAt == nil || !strings.Contains(strings.Join(statuses, " "), "cancelling") {
				t.Errorf("cancel: %+v statuses %v", b, statuses)
			}
		case StatusExpired:
			if b.ExpiredAt == nil || b.CompletedAt != nil {
				t.Errorf("expiry: %+v", b)
			}
		}
		got := readResults(t, out)
		if len(got) != n {
			t.Fatalf("%s: %d results for %d lines", tc.mode, len(got), n)
		}
		var ok, never int64
		for id, r := range got {
			switch {
			case r.ok:
				ok++
				checkEcho(t, id, r.line)
			case r.line.Error != nil && r.line.Error.Code == tc.code && r.line.Response == nil:
				never++
			default:
				t.Errorf("%s: %s: %+v", tc.mode, id, r.line)
			}
		}
		if ok != c.Completed || never != c.Failed {
			t.Errorf("%s: files have %d ok, %d %s; counts %+v", tc.mode, ok, never, tc.code, c)
		}
	}
}
