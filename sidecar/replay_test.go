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

// TestStaleRetryWrittenWhole: a request written whole on a reused
// connection that the model server reads and then closes without an
// answer may have been run: relayed or a decode leg, it is not sent again
// (the client gets the vLLM-shaped 503 and no new connection is
// dialled), unless it carries either idempotency header, with which it
// is replayed once on a new connection.
func TestStaleRetryWrittenWhole(t *testing.T) {
	pre := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, prefillAnswer) })
	for _, pd := range []bool{false, true} {
		for _, key := range []string{"", "Idempotency-Key", "X-Idempotency-Key"} {
			up := newBudgetServer(t, 0)
			pool := ""
			headers := map[string]string{}
			if pd {
				pool, headers["x-prefiller-host-port"] = poolFile(t, pre.addr()), pre.addr()
			}
			if key != "" {
				headers[key] = "once"
			}
			_, url := startSidecar(t, testOptions(up.port(), pool))
			if st, _, raw := post(t, url+"/v1/completions", headers, map[string]any{"model": "m", "prompt": "sound", "max_tokens": 1}); st != http.StatusOK {
				t.Fatalf("pd=%v key=%q: first request: %d %s", pd, key, st, raw)
			}
			// On the kept-alive connection, which the server closes once it
			// has read the request whole.
			st, _, raw := post(t, url+"/v1/completions", headers, map[string]any{"model": "m", "prompt": "stale, run me once", "max_tokens": 1})
			switch n := up.dials.Load(); {
			case key == "" && (st != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"object":"error"`) || n != 1):
				t.Fatalf("pd=%v, no key: %d %s with %d connections, want the decoder-down 503 and no replay", pd, st, raw, n)
			case key != "" && (st != http.StatusOK || !strings.Contains(string(raw), "run me once") || n != 2):
				t.Fatalf("pd=%v, %s: %d %s with %d connections, want the answer of one replay on a new connection", pd, key, st, raw, n)
			}
		}
	}
}

// breakableConn fails every write once broken is set, sending nothing: a
// connection the peer has reset, as the sidecar finds out only when it
// writes the next request.
type breakableConn struct {
	net.Conn
	broken *atomic.Bool
}

func (c breakableConn) Write(p []byte) (int, error) {
	if c.broken.Load() {
		return 0, errors.New("write: connection reset by peer")
	}
	return c.Conn.Write(p)
}

// TestStaleRetryUnwritten: a relayed request without an idempotency key
// whose write fails on a reused connection never reached the upstream
// whole, so it is replayed on a new connection, its body read once from
// the client and sent whole; the upstream sees it once.
func TestStaleRetryUnwritten(t *testing.T) {
	var arrived atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		arrived.Add(1)
		_, _ = w.Write(got)
	}))
	t.Cleanup(up.Close)
	var broken atomic.Bool
	pooled := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return breakableConn{Conn: c, broken: &broken}, nil
	}}
	fresh := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(pooled.CloseIdleConnections)
	rt := &staleRetry{pooled: pooled, fresh: fresh, max: 64 << 10, keep: bytebudget.New(64 << 10), full: prometheus.NewCounter(prometheus.CounterOpts{Name: "full"}), log: discard}
	send := func(body string) (string, error) {
		// No GetBody: a relayed client body, which net/http cannot replay.
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, up.URL+"/v1/completions", io.MultiReader(strings.NewReader(body)))
		if err != nil {
			return "", err
		}
		resp, err := (&http.Client{Transport: rt}).Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		return string(got), err
	}
	if got, err := send("warm"); err != nil || got != "warm" {
		t.Fatalf("warm-up: %q %v", got, err)
	}
	broken.Store(true)
	// Larger than the transport's 4 KiB write buffer, so that the failed
	// write happens while the request is written, as WroteRequest reports.
	body := strings.Repeat("x", 16<<10)
	if got, err := send(body); err != nil || got != body {
		t.Fatalf("after a failed write: %d bytes back, %v; want the %d-byte body echoed", len(got), err, len(body))
	}
	if n := arrived.Load(); n != 2 {
		t.Fatalf("the upstream got %d requests, want the warm-up and the one replay", n)
	}
}
