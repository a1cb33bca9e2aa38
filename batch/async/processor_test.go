package async

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/internal/testutil/redistest"
)

// gateway is a loopback HTTP server standing in for the inference gateway:
// it answers each request by the "prompt" of its body.
type gateway struct {
	srv     *httptest.Server
	mu      sync.Mutex
	seen    map[string]int // prompt → attempts
	headers map[string]http.Header
	// hold, when set, blocks requests until it is closed.
	hold     chan struct{}
	inFlight atomic.Int32
	maxSeen  atomic.Int32
}

func newGateway(t *testing.T) *gateway {
	g := &gateway{seen: map[string]int{}, headers: map[string]http.Header{}}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	n := g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	for {
		m := g.maxSeen.Load()
		if n <= m || g.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	var body struct{ Prompt string }
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &body)
	g.mu.Lock()
	g.seen[body.Prompt]++
	attempt := g.seen[body.Prompt]
	g.headers[body.Prompt] = r.Header.Clone()
	hold := g.hold
	g.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case body.Prompt == "bad":
		http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
	case strings.HasPrefix(body.Prompt, "shed") && attempt <= 2:
		w.Header().Set("Retry-After", "0")
		http.Error(w, "busy", http.StatusTooManyRequests)
	case body.Prompt == "down":
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	default:
		fmt.Fprintf(w, `{"path":%q,"prompt":%q,"attempt":%d}`, r.URL.Path, body.Prompt, attempt)
	}
}

func (g *gateway) attempts(prompt string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[prompt]
}

type fixture struct {
	rdb *redis.Client
	gw  *gateway
	reg *prometheus.Registry
	cfg Config
}

func newFixture(t *testing.T, gate string) *fixture {
	t.Helper()
	srv := redistest.Start(t)
	f := &fixture{rdb: redis.NewClient(&redis.Options{Addr: srv.Addr}), gw: newGateway(t), reg: prometheus.NewRegistry()}
	t.Cleanup(func() { f.rdb.Close() })
	raw := fmt.Sprintf(`{"url":"redis://%s/0","poll_interval_ms":20,"batch_size":10,
		"queues":[{"queue_name":"request-sortedset","igw_base_url":%q,"inference_objective":"batch-low"%s}]}`, srv.Addr, f.gw.srv.URL, gate)
	cfg, err := ParseConfig([]byte(raw), "")
	if err != nil {
		t.Fatal(err)
	}
	f.cfg = cfg
	return f
}

// run starts a processor until the test ends; stop ends it early.
func (f *fixture) run(t *testing.T, opts Options) (stop func()) {
	t.Helper()
	opts.Config, opts.Registerer = f.cfg, f.reg
	if opts.Backoff == (Backoff{}) {
		opts.Backoff = Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("processor: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (f *fixture) zadd(t *testing.T, member string, score float64) {
	t.Helper()
	if err := f.rdb.ZAdd(context.Background(), "request-sortedset", redis.Z{Score: score, Member: member}).Err(); err != nil {
		t.Fatal(err)
	}
}

func msg(id, prompt string, deadline int64) string {
	return fmt.Sprintf(`{"request_kind":"redis","internal":{},"data":{"id":%q,"created":1700000000,"deadline":%d,"payload":{"model":"m","prompt":%q},"metadata":{"userid":"tenant-%s"}}}`,
		id, deadline, prompt, id)
}

// results pops n results from the default result list, failing after
// limit.
func (f *fixture) results(t *testing.T, n int, limit time.Duration) map[string]Result {
	t.Helper()
	out := map[string]Result{}
	end := time.Now().Add(limit)
	for len(out) < n {
		left := time.Until(end)
		if left <= 0 {
			t.Fatalf("%d of %d results after %v: %v", len(out), n, limit, out)
		}
		v, err := f.rdb.BRPop(context.Background(), min(left, time.Second), DefaultResultQueue).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var r Result
		if err := json.Unmarshal([]byte(v[1]), &r); err != nil {
			t.Fatalf("result %s: %v", v[1], err)
		}
		if _, dup := out[r.ID]; dup {
			t.Fatalf("two results for %s", r.ID)
		}
		out[r.ID] = r
	}
	return out
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		sum := 0.0
	next:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return sum
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k {
			return l.GetValue() == v
		}
	}
	return false
}

func TestProcessor(t *testing.T) {
	f := newFixture(t, "")
	far := time.Now().Add(time.Hour).Unix()
	f.zadd(t, msg("ok", "hello", far), float64(far))
	f.zadd(t, msg("shed", "shed-1", far), float64(far))
	f.zadd(t, msg("bad", "bad", far), float64(far))
	f.zadd(t, msg("late", "late", 1700000000), 1700000000)
	// Deadlines are whole Unix seconds and a retry needs a second left, so
	// "down" gets 4: with 2, a first attempt that a loaded machine delays
	// by a second leaves no retry.
	soon := time.Now().Add(4 * time.Second).Unix()
	f.zadd(t, msg("down", "down", soon), float64(soon))
	// A bare message (no envelope) with its own endpoint.
	f.zadd(t, fmt.Sprintf(`{"id":"bare","deadline":%d,"payload":{"prompt":"bare"},"endpoint":"/v1/chat/completions"}`, far), float64(far))
	f.run(t, Options{Concurrency: 4})

	res := f.results(t, 5, 20*time.Second)
	if r := res["ok"]; r.StatusCode != 200 || !strings.Contains(r.Payload, `"prompt":"hello"`) || !strings.Contains(r.Payload, `"path":"/v1/completions"`) {
		t.Errorf("ok: %+v", r)
	}
	if r := res["bare"]; r.StatusCode != 200 || !strings.Contains(r.Payload, `"path":"/v1/chat/completions"`) {
		t.Errorf("bare: %+v", r)
	}
	// Two 429s, then success on the third attempt.
	if r := res["shed"]; r.StatusCode != 200 || !strings.Contains(r.Payload, `"attempt":3`) {
		t.Errorf("shed: %+v", r)
	}
	if r := res["bad"]; r.StatusCode != 400 || f.gw.attempts("bad") != 1 {
		t.Errorf("bad: %+v after %d attempts", r, f.gw.attempts("bad"))
	}
	// 503 until the deadline: the last answer is the result.
	if r := res["down"]; r.StatusCode != 503 || f.gw.attempts("down") < 2 {
		t.Errorf("down: %+v after %d attempts", r, f.gw.attempts("down"))
	}
	// Past its deadline at dequeue: dropped, never sent, no result.
	if _, ok := res["late"]; ok || f.gw.attempts("late") != 0 {
		t.Errorf("late message: result %v, %d attempts", ok, f.gw.attempts("late"))
	}
	h := f.gw.headers["hello"]
	if h.Get(HeaderInferenceObjective) != "batch-low" || h.Get(HeaderFairnessID) != "tenant-ok" || h.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", h)
	}
	q := map[string]string{"queue_id": "request-sortedset", "queue_name": "request-sortedset", "pool_name": "default"}
	for name, want := range map[string]float64{
		"llm_d_async_async_request_total":                    5,
		"llm_d_async_async_successful_requests_total":        3,
		"llm_d_async_async_failed_requests_total":            1,
		"llm_d_async_async_shedded_requests_total":           2,
		"llm_d_async_async_exceeded_deadline_requests_total": 1,
	} {
		if got := counter(t, f.reg, name, q); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := counter(t, f.reg, "llm_d_async_async_request_retries_total", q); got < 3 {
		t.Errorf("retries %v, want ≥ 3 (2 for shed, ≥ 1 for down)", got)
	}
	for _, key := range []string{"request-sortedset", ProcessingKey("request-sortedset"), DefaultRetryQueue} {
		if n, _ := f.rdb.ZCard(context.Background(), key).Result(); n != 0 {
			t.Errorf("%d messages left in %s", n, key)
		}
	}
}

// kill -9 at any moment: every message still gets exactly one result.
// Five processes in turn are killed while requests are in flight; the
// messages they held come back after the redelivery timeout.
func TestProcessorKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the kvgate binary")
	}
	bin, _ := kvgateBin(t)
	f := newFixture(t, "")
	slow := make(chan struct{})
	f.gw.hold = slow
	far := time.Now().Add(time.Hour).Unix()
	const n = 40
	for i := range n {
		f.zadd(t, msg(fmt.Sprint("k", i), fmt.Sprint("kill ", i), far), float64(far))
	}
	cfg, _ := json.Marshal(f.cfg)
	// The redelivery timeout must outlast every request a live process
	// holds (here: until the test releases it and kills the process), or
	// the process's own sweep sends it again and it gets two results. It
	// is 3 s so that a loaded machine's delays stay well within it.
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "async", "--transport-config", string(cfg), "--metrics-addr", "127.0.0.1:0", "--health-port", "0",
			"--concurrency", "4", "--redelivery-timeout", "3s")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	for kill := range 5 {
		cmd := start()
		end := time.Now().Add(20 * time.Second)
		for f.gw.inFlight.Load() < 4 {
			if time.Now().After(end) {
				t.Fatalf("kill %d: requests never arrived", kill)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if kill > 0 {
			// Let the held ones finish (later ones are held again), so that
			// kills land between results too.
			old := slow
			slow = make(chan struct{})
			f.gw.mu.Lock()
			f.gw.hold = slow
			f.gw.mu.Unlock()
			close(old)
			time.Sleep(30 * time.Millisecond)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	close(slow)
	f.gw.mu.Lock()
	f.gw.hold = nil
	f.gw.mu.Unlock()
	cmd := start()
	defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()
	res := f.results(t, n, 60*time.Second)
	for id, r := range res {
		if r.StatusCode != 200 {
			t.Errorf("%s: %+v", id, r)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if l, _ := f.rdb.LLen(context.Background(), DefaultResultQueue).Result(); l != 0 {
		t.Fatalf("%d results more than one per message", l)
	}
	for _, key := range []string{"request-sortedset", ProcessingKey("request-sortedset"), DefaultRetryQueue} {
		if c, _ := f.rdb.ZCard(context.Background(), key).Result(); c != 0 {
			t.Errorf("%d messages left in %s", c, key)
		}
	}
}

// local-max-concurrency holds dispatch at its limit: the rest stays in
// the sorted set until results free the gate.
func TestProcessorGateHolds(t *testing.T) {
	f := newFixture(t, `,"gate_type":"local-max-concurrency","gate_params":{"limit":"2"}`)
	f.gw.hold = make(chan struct{})
	far := time.Now().Add(time.Hour).Unix()
	for i := range 6 {
		f.zadd(t, msg(fmt.Sprint(i), fmt.Sprint("p", i), far), float64(far))
	}
	f.run(t, Options{Concurrency: 8})
	deadline := time.Now().Add(10 * time.Second)
	for f.gw.inFlight.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the first two requests never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Many polls later, still two in flight and four queued.
	for range 10 {
		time.Sleep(20 * time.Millisecond)
		if n := f.gw.inFlight.Load(); n != 2 {
			t.Fatalf("%d in flight, limit 2", n)
		}
	}
	if n, _ := f.rdb.ZCard(context.Background(), "request-sortedset").Result(); n != 4 {
		t.Fatalf("%d queued while the gate is closed, want 4", n)
	}
	q := map[string]string{"queue_name": "request-sortedset", "reason": ReasonGateClosed}
	if got := counter(t, f.reg, "llm_d_async_async_gate_decisions_total", q); got < 5 {
		t.Errorf("gate_closed decisions %v while held", got)
	}
	if got := counter(t, f.reg, "llm_d_async_async_dispatch_budget", nil); got != 0 {
		t.Errorf("dispatch budget %v while held", got)
	}
	close(f.gw.hold)
	f.results(t, 6, 10*time.Second)
	if m := f.gw.maxSeen.Load(); m > 2 {
		t.Fatalf("%d requests were in flight at once, limit 2", m)
	}
}

// Client.Do round-trips through the processor on the client's own result
// list; Cancel answers a queued request CANCELLED.
func TestClient(t *testing.T) {
	f := newFixture(t, "")
	c := NewClient(f.rdb, ClientOptions{})
	defer c.Close()
	// Cancelled before any processor runs.
	far := time.Now().Add(time.Hour)
	if err := c.Submit(context.Background(), Request{ID: "gone", Deadline: far.Unix(), Payload: json.RawMessage(`{"prompt":"gone"}`),
		ResultQueueName: c.ResultList()}); err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(context.Background(), "gone"); err != nil {
		t.Fatal(err)
	}
	f.run(t, Options{Concurrency: 4})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			rep, err := c.Do(context.Background(), Call{Body: []byte(fmt.Sprintf(`{"prompt":"do-%d"}`, i)), Deadline: far, Path: "/v1/chat/completions"})
			if err != nil {
				t.Errorf("Do %d: %v", i, err)
				return
			}
			if rep.StatusCode != 200 || !strings.Contains(string(rep.Body), fmt.Sprintf(`"prompt":"do-%d"`, i)) {
				t.Errorf("Do %d: %d %s", i, rep.StatusCode, rep.Body)
			}
		})
	}
	wg.Wait()
	// A 4xx is an answer, not an error.
	rep, err := c.Do(context.Background(), Call{Body: []byte(`{"prompt":"bad"}`), Deadline: far})
	if err != nil || rep.StatusCode != 400 {
		t.Fatalf("bad: %v %v", rep, err)
	}
	// The cancelled request's result came to the client's list (nobody
	// waits for it); it was never sent.
	if f.gw.attempts("gone") != 0 {
		t.Fatal("a cancelled request was dispatched")
	}
	if _, err := c.Do(context.Background(), Call{Body: []byte(`{"prompt":"x"}`), Deadline: time.Unix(1700000000, 0)}); err == nil {
		t.Fatal("Do with a past deadline succeeded")
	}
}

// At shutdown, a request still in flight after the drain timeout goes back
// to the retry set: nothing is lost.
func TestProcessorShutdownRequeues(t *testing.T) {
	f := newFixture(t, "")
	f.gw.hold = make(chan struct{})
	defer close(f.gw.hold)
	far := time.Now().Add(time.Hour).Unix()
	f.zadd(t, msg("held", "held", far), float64(far))
	stop := f.run(t, Options{Concurrency: 2, DrainTimeout: 50 * time.Millisecond})
	deadline := time.Now().Add(10 * time.Second)
	for f.gw.inFlight.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the request never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	members, err := f.rdb.ZRange(context.Background(), DefaultRetryQueue, 0, -1).Result()
	if err != nil || len(members) != 1 {
		t.Fatalf("retry set %v %v", members, err)
	}
	e, err := DecodeEnvelope([]byte(members[0]))
	if err != nil || e.Request.ID != "held" || e.Routing.RequestQueueName != "request-sortedset" {
		t.Fatalf("re-queued %+v %v", e, err)
	}
}
