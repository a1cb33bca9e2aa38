package sidecar

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
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
		rt := &staleRetry{pooled: lateHookTransport{late: late}, fresh: fresh, max: 1 << 10, log: discard}
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
