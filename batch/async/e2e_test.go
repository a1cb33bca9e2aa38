package async

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/demo"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/testutil/proctest"
	"github.com/kvgate/kvgate/internal/testutil/redistest"
)

var (
	binOnce          sync.Once
	binPath, wasmBin string
	binErr           error
)

// kvgateBin is $KVGATE_BIN_DIR's binaries (what `make test` built), or
// ones built once for this package's tests.
func kvgateBin(t *testing.T) (bin, wasm string) {
	t.Helper()
	binOnce.Do(func() {
		if d := os.Getenv("KVGATE_BIN_DIR"); d != "" {
			binPath, wasmBin = filepath.Join(d, "kvgate"), filepath.Join(d, "kvgate-filter.wasm")
			return
		}
		dir, err := os.MkdirTemp("", "kvgate-async-e2e-")
		if err != nil {
			binErr = err
			return
		}
		root := testutil.RepoRoot(t)
		binPath, wasmBin = filepath.Join(dir, "kvgate"), filepath.Join(dir, "kvgate-filter.wasm")
		for _, b := range []struct {
			env  []string
			args []string
		}{
			{nil, []string{"-o", binPath, "./cmd/kvgate"}},
			{[]string{"GOEXPERIMENT=jsonv2", "GOOS=wasip1", "GOARCH=wasm"}, []string{"-buildmode=c-shared", "-o", wasmBin, "./wasm-filter"}},
		} {
			cmd := exec.Command("go", append([]string{"build"}, b.args...)...)
			cmd.Dir, cmd.Env = root, append(os.Environ(), b.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				binErr = fmt.Errorf("go build %v: %w\n%s", b.args, err, out)
				return
			}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath, wasmBin
}

// The picker's flow control with the concurrency detector at 2 requests
// per server: its pool saturation is in-flight requests / 4 on two sims.
const e2ePicker = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates:
- flowControl
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters:
    maxConcurrency: 2
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
flowControl:
  saturationDetector:
    pluginRef: concurrency-detector
`

// asyncListening is `kvgate async`'s line naming the metrics address it
// bound: the test gives it port 0, so no other process can take the port
// between the test choosing it and the child binding it.
var asyncListening = regexp.MustCompile(`msg=listening server=metrics addr=(\S+)`)

// startFleet starts sims, the picker and the gateway for the test.
func startFleet(t *testing.T, c demo.StackConfig) *demo.Stack {
	t.Helper()
	c.TokenizerDir = testutil.TokenizerDir(t)
	c.Bin, c.Wasm = kvgateBin(t)
	c.Policy, c.LogDir, c.NumGPUBlocks, c.HashSeed, c.Ready = demo.PolicyLoad, t.TempDir(), 2048, "42", 30*time.Second
	stack, err := demo.StartStack(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	return stack
}

// scrapeValue is the largest sample of metric (with labels) on a page; ok
// false when absent.
func scrapeValue(url, metric string, labels map[string]string) (float64, bool) {
	v, err := (&Scrape{URL: url, Metric: metric, Labels: labels}).Read(context.Background())
	return v, err == nil
}

// Requests enqueued in Redis go through `kvgate async` → `kvgate gateway` →
// picker → sims and their results reach the result list; while the
// picker's pool is saturated the picker-saturation gate holds them in the
// sorted set; an expired message is dropped without being sent.
func TestE2EAsyncThroughTheFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet of processes")
	}
	rs := redistest.Start(t)
	bin, _ := kvgateBin(t)
	stack := startFleet(t, demo.StackConfig{Replicas: 2, PickerConfig: e2ePicker, TimeScale: 0.02})

	cfg := fmt.Sprintf(`{"url":"redis://%s/0","poll_interval_ms":50,"batch_size":10,"queues":[{"queue_name":"request-sortedset",
		"igw_base_url":%q,"inference_objective":"batch","gate_type":"composite","gate_params":{"gates":[
		{"gate_type":"local-max-concurrency","gate_params":{"limit":"4"}},
		{"gate_type":"picker-saturation","gate_params":{"url":%q,"pool":"kvgate","threshold":"0.5"}}]}}]}`,
		rs.Addr, stack.GatewayURL, stack.EPPMetricsURL)
	proc, metricsAddr := proctest.Start(t, asyncListening, nil, bin, "async", "--transport-config", cfg, "--metrics-addr", "127.0.0.1:0",
		"--health-port", "0", "--concurrency", "8")
	logs := proc.Log
	asyncMetrics := "http://" + metricsAddr + "/metrics"
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ctx := t.Context()

	complete := func(maxTokens int) error {
		body, _ := json.Marshal(map[string]any{"model": demo.Model, "prompt": "an online request", "max_tokens": maxTokens})
		resp, err := http.Post(stack.GatewayURL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("online request: %d %s", resp.StatusCode, b)
		}
		return nil
	}
	// Online traffic holds 4 requests in flight: the picker measured
	// saturation 3/4 when it dispatched the last.
	online := make(chan error, 4)
	for range 4 {
		go func() { online <- complete(60) }()
	}
	await := func(what string, cond func() bool) {
		t.Helper()
		end := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	await("the picker's saturation at 0.75", func() bool {
		v, ok := scrapeValue(stack.EPPMetricsURL, MetricPoolSaturationLLMD, map[string]string{"stage": "effective"})
		return ok && v >= 0.75
	})
	far := time.Now().Add(time.Hour).Unix()
	const n = 6
	for i := range n {
		body := fmt.Sprintf(`{"model":%q,"prompt":"async request %d","max_tokens":2}`, demo.Model, i)
		m := fmt.Sprintf(`{"request_kind":"redis","internal":{},"data":{"id":"a%d","created":1700000000,"deadline":%d,"payload":%s}}`, i, far, body)
		if err := rdb.ZAdd(ctx, "request-sortedset", redis.Z{Score: float64(far), Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	expired := fmt.Sprintf(`{"request_kind":"redis","internal":{},"data":{"id":"late","deadline":1700000000,"payload":{"model":%q,"prompt":"late"}}}`, demo.Model)
	if err := rdb.ZAdd(ctx, "request-sortedset", redis.Z{Score: 1700000000, Member: expired}).Err(); err != nil {
		t.Fatal(err)
	}
	// While the online requests run, the gate holds: nothing leaves the
	// sorted set, and the processor counts closed polls.
	held := 0
	for stillOnline := true; stillOnline && held < 20; {
		select {
		case err := <-online:
			if err != nil {
				t.Fatal(err)
			}
			stillOnline = false
			online <- nil
		case <-time.After(50 * time.Millisecond):
			if c, _ := rdb.ZCard(ctx, "request-sortedset").Result(); c != n+1 {
				t.Fatalf("%d messages queued while the pool is saturated, want %d", c, n+1)
			}
			held++
		}
	}
	if held < 5 {
		t.Fatalf("the online requests ended after %d checks; make them longer", held)
	}
	closed, _ := scrapeValue(asyncMetrics, "llm_d_async_async_gate_decisions_total", map[string]string{"reason": ReasonGateClosed})
	budget, _ := scrapeValue(asyncMetrics, "llm_d_async_async_dispatch_budget", nil)
	if closed == 0 || budget != 0 {
		t.Fatalf("while held: gate_closed %v, dispatch budget %v", closed, budget)
	}
	for range 4 {
		if err := <-online; err != nil {
			t.Fatal(err)
		}
	}
	// The online requests ended: the picker's saturation fell with their
	// releases, and the gate opens.
	got := map[string]Result{}
	end := time.Now().Add(30 * time.Second)
	for len(got) < n {
		if time.Now().After(end) {
			t.Fatalf("%d of %d results: %v", len(got), n, got)
		}
		v, err := rdb.BRPop(ctx, time.Second, DefaultResultQueue).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var r Result
		if err := json.Unmarshal([]byte(v[1]), &r); err != nil {
			t.Fatal(err)
		}
		if r.StatusCode != 200 || !strings.Contains(r.Payload, `"text_completion"`) {
			t.Fatalf("result %+v", r)
		}
		if _, dup := got[r.ID]; dup {
			t.Fatalf("two results for %s", r.ID)
		}
		got[r.ID] = r
	}
	if _, ok := got["late"]; ok {
		t.Fatal("the expired message was answered")
	}
	if c, _ := rdb.ZCard(ctx, "request-sortedset").Result(); c != 0 {
		t.Fatalf("%d messages left", c)
	}
	if v, ok := scrapeValue(asyncMetrics, "llm_d_async_async_successful_requests_total", nil); !ok || v != n {
		t.Fatalf("successful_requests_total %v", v)
	}
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "level=ERROR") {
			t.Errorf("processor error: %s", sc.Text())
		}
	}
}

// Retries through the fleet: the simulators answer half the requests with
// a 500, or the picker's flow control refuses (429) what does not fit one
// running request and one queued; the processor retries each until it
// succeeds, and every message gets exactly one result, a 200.
func TestE2EAsyncRetriesThroughTheFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet of processes")
	}
	const oneAtATime = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates:
- flowControl
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters:
    maxConcurrency: 1
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
flowControl:
  maxRequests: 1
  saturationDetector:
    pluginRef: concurrency-detector
`
	for _, tc := range []struct {
		name   string
		fleet  demo.StackConfig
		metric string
	}{
		{"sims answer 500", demo.StackConfig{Replicas: 2, TimeScale: 1, SimFailureRate: 0.5}, "llm_d_async_async_request_retries_total"},
		{"picker sheds 429", demo.StackConfig{Replicas: 1, TimeScale: 0.2, PickerConfig: oneAtATime}, "llm_d_async_async_shedded_requests_total"},
	} {
		t.Run(tc.name, func(t *testing.T) { retriesThroughTheFleet(t, tc.fleet, tc.metric) })
	}
}

func retriesThroughTheFleet(t *testing.T, fleet demo.StackConfig, metric string) {
	rs := redistest.Start(t)
	stack := startFleet(t, fleet)
	cfg, err := ParseConfig([]byte(fmt.Sprintf(`{"url":"redis://%s/0","poll_interval_ms":20,"queues":[{"queue_name":"q","igw_base_url":%q}]}`,
		rs.Addr, stack.GatewayURL)), "")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p, err := New(Options{Config: cfg, Concurrency: 8, Registerer: reg, Backoff: Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	c := NewClient(rdb, ClientOptions{Queue: "q"})
	defer c.Close()
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":%q,"prompt":"retry %d","max_tokens":2}`, demo.Model, i)
			rep, err := c.Do(ctx, Call{ID: fmt.Sprint("r", i), Body: []byte(body), Deadline: time.Now().Add(time.Hour)})
			if err != nil || rep.StatusCode != 200 || !strings.Contains(string(rep.Body), `"text_completion"`) {
				t.Errorf("request %d: %v %d %s", i, err, rep.StatusCode, rep.Body)
			}
		})
	}
	wg.Wait()
	retries := counter(t, reg, metric, nil)
	ok := counter(t, reg, "llm_d_async_async_successful_requests_total", nil)
	if retries == 0 || ok != n {
		t.Fatalf("%s %v, successes %v of %d", metric, retries, ok, n)
	}
	if l, _ := rdb.LLen(ctx, c.ResultList()).Result(); l != 0 {
		t.Fatalf("%d results nobody took", l)
	}
}
