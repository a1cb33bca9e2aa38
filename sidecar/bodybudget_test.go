package sidecar

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// TestBodyBudget: a P/D request's body is reserved from --body-budget-bytes
// while its legs run; a request that finds the budget spent is refused
// with the vLLM-shaped 503 and counted, and the bytes come back when the
// request ends.
func TestBodyBudget(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	pre := newRecorder(t, func(w http.ResponseWriter, n int, _ leg) {
		if n == 1 { // the first prefill leg holds its request's body reserved
			<-release
		}
		writeJSONReply(w, http.StatusOK, prefillAnswer)
	})
	t.Cleanup(unblock) // before the recorder's Close, which waits for its handlers
	dec := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, map[string]any{}) })
	o := testOptions(dec.port(), poolFile(t, pre.addr()))
	// One body reserves ReadUpTo's first step (64 KiB): room for one.
	o.BodyBudgetBytes = 100 << 10
	s, url := startSidecar(t, o)
	headers := map[string]string{eppwire.HeaderPrefiller: pre.addr()}
	body := map[string]any{"model": "m", "prompt": strings.Repeat("p", 1000), "max_tokens": 4}

	first := make(chan int, 1)
	go func() {
		st, _, _ := post(t, url+"/v1/completions", headers, body)
		first <- st
	}()
	// Its body is reserved before its prefill leg is sent.
	for deadline := time.Now().Add(testTimeout); len(pre.got()) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first prefill leg never arrived")
		}
	}
	st, _, raw := post(t, url+"/v1/completions", headers, body)
	if st != http.StatusServiceUnavailable || !strings.Contains(string(raw), "--body-budget-bytes") {
		t.Fatalf("with the budget spent: %d %s, want 503 naming --body-budget-bytes", st, raw)
	}
	if n := testutil.ToFloat64(s.m.bodyBudgetFull); n != 1 {
		t.Fatalf("kvgate_sidecar_body_budget_full_total = %v, want 1", n)
	}
	unblock()
	if st := <-first; st != http.StatusOK {
		t.Fatalf("the held request: %d", st)
	}
	if used := s.bodies.Used(); used != 0 {
		t.Fatalf("%d bytes still reserved after every request ended", used)
	}
	if st, _, raw := post(t, url+"/v1/completions", headers, body); st != http.StatusOK {
		t.Fatalf("after the budget came back: %d %s", st, raw)
	}
}
