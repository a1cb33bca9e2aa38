package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestEarlyHeaderKeepsTheAnswer: the sidecar's issue 16 (see
// testutil.EarlyHeaderThrough) can reach the gateway too: 4 of 1200
// answers were cut before it forwarded full duplex. The client's body
// reaches the transport unread without a filter, with a picker that does
// not take the body (mode none) or none at all; both take the same path
// upstream, TestHeaderBeforeTheBody covers both, and this race, which
// shows only now and then, runs on one.
func TestEarlyHeaderKeepsTheAnswer(t *testing.T) {
	testutil.EarlyHeaderThrough(t, func(upstream string) string {
		return startGateway(t, gateway.Config{Fallback: []string{upstream}})
	})
}

// TestHeaderBeforeTheBody: an upstream may answer before it reads the
// body and read it afterwards (a streaming upload). The gateway must pass
// the header on while the client still sends, and the whole body on to the
// upstream: net/http's HTTP/1 server, unless told the handler is full
// duplex, reads the rest of the body itself before it writes the header
// (when less than 256 KiB of it is left), so the header waited for a body
// this client sends only after the header, and a client that does send it
// lost it to that read.
func TestHeaderBeforeTheBody(t *testing.T) {
	const half = 64 << 10
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		// A first event, since the gateway sends a header on with the
		// first body bytes.
		_, _ = io.WriteString(w, "data: {\"started\":true}\n\n")
		_ = rc.Flush()
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "data: {\"read\":%d,\"err\":%q}\n\ndata: [DONE]\n\n", n, fmt.Sprint(err))
	}))
	t.Cleanup(up.Close)
	addr := strings.TrimPrefix(up.URL, "http://")
	for _, tc := range []struct {
		name string
		cfg  gateway.Config
	}{
		{"no picker", gateway.Config{Fallback: []string{addr}}},
		{"picker, body mode none", gateway.Config{ExtProc: startPicker(t, &testPicker{endpoints: addr}), RequestBodyMode: gateway.None}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startGateway(t, tc.cfg)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // hang guard
			defer cancel()
			pr, pw := io.Pipe()
			// The client's transport waits for its body's writer before
			// Do returns an error: the guard ends the body too.
			stop := context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })
			defer stop()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", pr)
			req.ContentLength = 2 * half
			first := make(chan error, 1)
			go func() {
				_, err := pw.Write(bytes.Repeat([]byte("a"), half))
				first <- err
			}()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("no header while the body is half sent: %v", err)
			}
			defer resp.Body.Close()
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			if _, err := pw.Write(bytes.Repeat([]byte("b"), half)); err != nil {
				t.Fatal(err)
			}
			_ = pw.Close()
			sse := testutil.NewSSEReader(resp.Body)
			if data, err := sse.NextData(); err != nil || data != `{"started":true}` {
				t.Fatalf("first event %q (%v)", data, err)
			}
			data, err := sse.NextData()
			if want := fmt.Sprintf(`{"read":%d,"err":"<nil>"}`, 2*half); err != nil || data != want {
				t.Fatalf("upstream answered %q (%v), want %s", data, err, want)
			}
		})
	}
}
