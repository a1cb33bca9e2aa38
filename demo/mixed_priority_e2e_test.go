package demo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestE2EEnginePriority, over real processes (sim, picker, gateway): one
// simulator with a single sequence slot, taken by a batch request, and
// queuedBatch more batch requests waiting in its engine; then one online
// request. With the engines at --scheduling-policy priority and the picker
// at --engine-priority it is served next, ahead of the queued batch; with
// the defaults (fcfs, no body priority) after all of them. Both fleets run
// in this test, one after the other; what is compared is the online
// request's queue position and its latency as a ratio.
func TestE2EEnginePriority(t *testing.T) {
	needE2E(t)
	// Below the utilization detector's default queue depth (5), so that the
	// picker does not shed the sheddable requests itself.
	const queuedBatch = 4
	objectives := filepath.Join(t.TempDir(), "objectives.yaml")
	if err := os.WriteFile(objectives, []byte(objectivesYAML()), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(enginePriority bool) (position int, latency time.Duration) {
		c := StackConfig{Replicas: 1, Policy: PolicyLoad, Objectives: objectives, SimArgs: []string{"--max-num-seqs=1"}}
		if enginePriority {
			enginePriorityArgs(&c)
		}
		s := startStack(t, c)
		simMetrics := "http://" + s.Sims[0].Addr + "/metrics"
		var served testutil.FirstTokens
		var wg sync.WaitGroup
		send := func(name, objective string, maxTokens int) {
			wg.Go(func() {
				body, _ := json.Marshal(map[string]any{"model": Model, "prompt": name, "max_tokens": maxTokens, "stream": true})
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.GatewayURL+"/v1/completions", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(eppwire.HeaderObjective, objective)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					raw, _ := io.ReadAll(resp.Body)
					t.Errorf("%s: %d %s", name, resp.StatusCode, raw)
					return
				}
				if err := served.Read(name, resp.Body); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			})
		}
		waitSim := func(what string, cond func(running, waiting float64) bool) {
			t.Helper()
			for range 500 {
				m, err := scrapeURL(t.Context(), simMetrics)
				if err == nil && cond(m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]) {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("simulator never had %s", what)
		}
		send("holder", objectiveBatch, 120)
		waitSim("the slot taken", func(r, _ float64) bool { return r == 1 })
		for i := range queuedBatch {
			send(fmt.Sprintf("batch-%d", i), objectiveBatch, 40)
		}
		waitSim("the batch queued", func(_, w float64) bool { return w == queuedBatch })
		start := time.Now()
		send("online", objectiveOnline, 1)
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		// The order served is the order of first tokens: with one slot each
		// request starts only after the one before has finished, while a
		// client may finish reading a long answer after the short one the
		// engine ran next.
		onlineAt, ok := served.At("online")
		if !ok {
			t.Fatalf("the online request got no token; served: %v", served.Order())
		}
		latency = onlineAt.Sub(start)
		position = served.Before("online", "batch-")
		t.Logf("engine priority %v: first-token order %v; online after %d of %d queued batch requests, its first token %v after it was sent",
			enginePriority, served.Order(), position, queuedBatch, latency)
		return position, latency
	}
	fcfsPos, fcfsLat := run(false)
	prioPos, prioLat := run(true)
	if fcfsPos != queuedBatch || prioPos != 0 {
		t.Fatalf("online request's queue position: fcfs %d (want %d), priority %d (want 0)", fcfsPos, queuedBatch, prioPos)
	}
	ratio := float64(prioLat) / float64(fcfsLat)
	t.Logf("online latency, engine priority / fcfs = %.2f", ratio)
	if ratio > 0.7 {
		t.Fatalf("online latency with engine priority %v is %.2f of fcfs's %v; want well under", prioLat, ratio, fcfsLat)
	}
}
