package vllmserver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

func TestRequestPriority(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want int
		err  string
	}{
		{"", 0, ""},
		{"0", 0, ""},
		{"-100", -100, ""},
		{"7", 7, ""},
		{"3.0", 3, ""},
		{"1e3", 1000, ""},
		{`"12"`, 12, ""},
		{`" -4 "`, -4, ""},
		{"true", 1, ""},
		{"false", 0, ""},
		{"1.5", 0, "fractional part"},
		{`"high"`, 0, "unable to parse string"},
		{`"1.0"`, 0, "unable to parse string"},
		{"null", 0, "valid integer"},
		{"[1]", 0, "valid integer"},
		{`{"p":1}`, 0, "valid integer"},
		{"1e300", 0, "out of range"},
		{"123456789012345678901234567890", 0, "out of range"},
	} {
		got, err := requestPriority(json.RawMessage(tc.raw))
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %d, %v; want %d", tc.raw, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %d, %v; want an error with %q", tc.raw, got, err, tc.err)
		}
	}
}

func FuzzRequestPriority(f *testing.F) {
	for _, s := range []string{"0", "-1", "2.0", `"3"`, "true", "null", "1e400", "[]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		n, err := requestPriority(json.RawMessage(raw))
		if err != nil && n != 0 {
			t.Fatalf("%q: %d with error %v", raw, n, err)
		}
	})
}

// TestPriorityErrors: under fcfs a non-zero priority is refused as vLLM's
// engine refuses it, a malformed one under either policy; zero always
// passes.
func TestPriorityErrors(t *testing.T) {
	fcfs := startServer(t, testOptions(t))
	po := testOptions(t)
	po.SchedulingPolicy = "priority"
	prio := startServer(t, po)
	for _, tc := range []struct {
		name     string
		srv      *Server
		path     string
		priority string
		status   int
		msg      string
	}{
		{"fcfs zero", fcfs, "/v1/completions", "0", 200, ""},
		{"fcfs non-zero", fcfs, "/v1/completions", "-1", 400, "Got priority -1 but Priority scheduling is not enabled."},
		{"fcfs chat non-zero", fcfs, "/v1/chat/completions", "5", 400, "Got priority 5 but Priority scheduling is not enabled."},
		{"fcfs malformed", fcfs, "/v1/completions", `"high"`, 400, "valid integer"},
		{"priority non-zero", prio, "/v1/completions", "-100", 200, ""},
		{"priority chat string", prio, "/v1/chat/completions", `"3"`, 200, ""},
		{"priority fractional", prio, "/v1/completions", "0.5", 400, "fractional part"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"Qwen/Qwen3-0.6B","prompt":"x","max_tokens":1,"priority":` + tc.priority + `}`
			if strings.Contains(tc.path, "chat") {
				body = `{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"x"}],"max_tokens":1,"priority":` + tc.priority + `}`
			}
			status, raw := post(t, tc.srv.URL()+tc.path, body)
			if status != tc.status {
				t.Fatalf("status %d body %s", status, raw)
			}
			if tc.status == 200 {
				return
			}
			if e, err := errorBody(raw); err != nil || e.Type != "BadRequestError" || e.Code != 400 || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("body %s (%v)", raw, err)
			}
		})
	}
	if _, err := ParseFlags([]string{"--scheduling-policy", "lifo"}, new(strings.Builder)); err == nil || !strings.Contains(err.Error(), "--scheduling-policy") {
		t.Fatalf("--scheduling-policy lifo: %v", err)
	}
}

// TestPrioritySchedulingOverLoopback: one sequence slot, taken by a
// request, and queuedLow sheddable requests waiting behind it; then one
// important request arrives. Under --scheduling-policy priority it is
// served next, ahead of every queued one; under fcfs after all of them.
// The order served is the order of first tokens: with one slot each
// request starts only after the one before has finished, while the order
// in which clients finish reading may swap a long answer and the short
// one the engine ran next. Both servers run side by side in this test, so
// the load of the machine touches both alike; the comparison is a queue
// position and a ratio.
func TestPrioritySchedulingOverLoopback(t *testing.T) {
	const queuedLow = 6
	run := func(policy string, low, high int) (position int, latency time.Duration) {
		o := testOptions(t)
		o.SchedulingPolicy, o.MaxNumSeqs, o.TimeScale = policy, 1, 1
		s := startServer(t, o)
		var served testutil.FirstTokens
		var wg sync.WaitGroup
		send := func(name string, priority, maxTokens int) {
			wg.Go(func() {
				body := fmt.Sprintf(`{"model":"Qwen/Qwen3-0.6B","prompt":"%s","max_tokens":%d,"priority":%d,"stream":true}`, name, maxTokens, priority)
				resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Errorf("%s %s: %v", policy, name, err)
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					raw, _ := io.ReadAll(resp.Body)
					t.Errorf("%s %s: %d %s", policy, name, resp.StatusCode, raw)
					return
				}
				if err := served.Read(name, resp.Body); err != nil {
					t.Errorf("%s %s: %v", policy, name, err)
				}
			})
		}
		send("holder", low, 60)
		waitFor(t, "the slot taken", func() bool { return s.Engine().Metrics().Running == 1 })
		for i := range queuedLow {
			send(fmt.Sprintf("batch %d", i), low, 20)
		}
		waitFor(t, "the sheddable requests queued", func() bool { return s.Engine().Metrics().Waiting == queuedLow })
		start := time.Now()
		send("online", high, 1)
		waitFor(t, "the online request queued", func() bool { return s.Engine().Metrics().Waiting == queuedLow+1 })
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		onlineAt, _ := served.At("online")
		latency = onlineAt.Sub(start)
		position = served.Before("online", "batch ")
		t.Logf("%s: first-token order %v; online served after %d of %d queued sheddable requests, its first token %v after it arrived",
			policy, served.Order(), position, queuedLow, latency)
		return position, latency
	}
	fcfsPos, fcfsLat := run("fcfs", 0, 0)
	prioPos, prioLat := run("priority", 1, -100)
	if fcfsPos != queuedLow || prioPos != 0 {
		t.Fatalf("online request's queue position: fcfs %d (want %d), priority %d (want 0)", fcfsPos, queuedLow, prioPos)
	}
	ratio := float64(prioLat) / float64(fcfsLat)
	t.Logf("online latency priority/fcfs = %.2f", ratio)
	if ratio > 0.6 {
		t.Fatalf("online latency under priority %v is %.2f of fcfs's %v; want well under", prioLat, ratio, fcfsLat)
	}
}
