package sidecar

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/bytebudget"
	"github.com/kvgate/kvgate/internal/testutil"
)

// lateHookTransport fails every request as a stale keep-alive connection
// does (GotConn reused, then an error), and calls GotFirstResponseByte
// from another goroutine that RoundTrip does not wait for, as net/http's
// response reader may: httptrace's hooks "may be called concurrently from
// different goroutines and some may be called after the request has
// completed or failed".
type lateHookTransport struct{ late chan struct{} }

func (l lateHookTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
	}
	trace := httptrace.ContextClientTrace(req.Context())
	trace.GotConn(httptrace.GotConnInfo{Reused: true})
	go func() {
		trace.GotFirstResponseByte()
		close(l.late)
	}()
	return nil, errors.New("connection reset by peer")
}

// answerTransport answers every request 200, counting them.
type answerTransport struct{ n atomic.Int32 }

func (a *answerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	a.n.Add(1)
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: req}, nil
}

// TestStaleRetryHooksFromTheReader: a trace hook the transport calls on
// its own goroutine while (or after) a RoundTrip fails is no data race
// with RoundTrip's decision to replay (go test -race), for a relayed body
// and a buffered one (GetBody) alike; the one replay goes to the fresh
// transport.
func TestStaleRetryHooksFromTheReader(t *testing.T) {
	for _, buffered := range []bool{false, true} {
		late := make(chan struct{})
		fresh := &answerTransport{}
		rt := &staleRetry{pooled: lateHookTransport{late: late}, fresh: fresh, max: 1 << 10, keep: bytebudget.New(1 << 10), full: prometheus.NewCounter(prometheus.CounterOpts{Name: "full"}), log: discard}
		var body io.Reader = strings.NewReader(`{"prompt":"x"}`)
		if !buffered {
			body = io.MultiReader(body) // no GetBody: a relayed client body
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://127.0.0.1:1/v1/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		if (req.GetBody != nil) != buffered {
			t.Fatalf("buffered=%v: GetBody %v", buffered, req.GetBody != nil)
		}
		resp, err := rt.RoundTrip(req)
		<-late
		if err == nil {
			resp.Body.Close()
		}
		// Whether the late hook counted is up to the scheduler; at most one
		// replay either way, and it answers.
		if n := fresh.n.Load(); n > 1 || (n == 1) != (err == nil) {
			t.Fatalf("buffered=%v: %d replays, err %v", buffered, n, err)
		}
	}
}

// TestRunClosesIdleUpstreamConnections: once Run returns, the sidecar's
// keep-alive connections to its upstreams are closed, not left open until
// their idle timeout (90 s) with a reader goroutine each; the stale-retry
// wrapper passes CloseIdleConnections on to the pooled transport.
func TestRunClosesIdleUpstreamConnections(t *testing.T) {
	var open atomic.Int32
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		writeJSONReply(w, http.StatusOK, map[string]any{"id": "d", "usage": map[string]int{"prompt_tokens": 1, "completion_tokens": 1}})
	}))
	up.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	s, err := New(testOptions(up.Listener.Addr().(*net.TCPAddr).Port, ""))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	st, _, raw := post(t, "http://"+s.Addr().String()+"/v1/completions", nil, map[string]any{"model": "m", "prompt": "x"})
	if st != http.StatusOK {
		t.Fatalf("%d %s", st, raw)
	}
	if n := open.Load(); n != 1 {
		t.Fatalf("%d connections to the upstream open, want the one kept alive", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	testutil.WaitFor(t, "the sidecar's idle upstream connection to close", func() bool { return open.Load() == 0 })
}

// staleTransport fails every request as a stale keep-alive connection
// does: a reused connection, then an error before any answer.
type staleTransport struct{}

func (staleTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	httptrace.ContextClientTrace(req.Context()).GotConn(httptrace.GotConnInfo{Reused: true})
	return nil, errors.New("connection reset by peer")
}

// TestStaleRetryGetBodyFails: when the buffered body cannot be had again
// for the replay, the caller learns both why the request failed and why
// it was not replayed.
func TestStaleRetryGetBodyFails(t *testing.T) {
	fresh := &answerTransport{}
	rt := &staleRetry{pooled: staleTransport{}, fresh: fresh, max: 1 << 10, keep: bytebudget.New(1 << 10), full: prometheus.NewCounter(prometheus.CounterOpts{Name: "full"}), log: discard}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://127.0.0.1:1/v1/completions", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("body gone") }
	_, err = rt.RoundTrip(req)
	if err == nil || !strings.Contains(err.Error(), "connection reset by peer") || !strings.Contains(err.Error(), "body gone") || fresh.n.Load() != 0 {
		t.Fatalf("RoundTrip: %v (%d replays), want the failure and GetBody's error, no replay", err, fresh.n.Load())
	}
}
