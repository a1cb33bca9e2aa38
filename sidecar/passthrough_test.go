package sidecar

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

// TestPassthroughStreamsWholeBody is the regression for a local
// (non-P/D) request answered 200 with an empty body (issue 16, see
// testutil.EarlyHeaderThrough): every answer must arrive whole.
func TestPassthroughStreamsWholeBody(t *testing.T) {
	testutil.EarlyHeaderThrough(t, func(upstream string) string {
		_, port, _ := net.SplitHostPort(upstream)
		p, _ := strconv.Atoi(port)
		_, url := startSidecar(t, testOptions(p, ""))
		return url
	})
}

// cutShortServer sends a header and the start of an answer, then drops
// the connection: an SSE stream without its end, or a JSON body shorter
// than its Content-Length.
func cutShortServer(t *testing.T, sse bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if sse {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}]}\n\n")
		} else {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, `{"id":"d","choices":[`)
		}
		_ = http.NewResponseController(w).Flush()
		time.Sleep(5 * time.Millisecond)
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestUpstreamCutShort: when the model server's answer breaks off after
// its header, the client sees a failure, never a complete-looking 200:
// the connection is aborted once the header went out, and a held JSON
// answer (cached_tokens rewriting) becomes a vLLM-shaped 502.
func TestUpstreamCutShort(t *testing.T) {
	pre := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, prefillAnswer) })
	for _, tc := range []struct {
		name    string
		sse, pd bool
		want502 bool
	}{
		{"pass/sse", true, false, false},
		{"pass/json", false, false, false},
		{"nixlv2/sse", true, true, false},
		{"nixlv2/json", false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := cutShortServer(t, tc.sse)
			_, url := startSidecar(t, testOptions(ms.Listener.Addr().(*net.TCPAddr).Port, poolFile(t, pre.addr())))
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
				strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":"hi","max_tokens":5,"stream":%v}`, tc.sse)))
			req.Header.Set("Content-Type", "application/json")
			if tc.pd {
				req.Header.Set("x-prefiller-host-port", pre.addr())
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if tc.want502 {
					t.Fatalf("want a 502, got %v", err)
				}
				return // the failure reached the client
			}
			raw, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tc.want502 {
				if resp.StatusCode != http.StatusBadGateway || rerr != nil || !strings.Contains(string(raw), `"object":"error"`) {
					t.Fatalf("want a vLLM-shaped 502, got %d %q (%v)", resp.StatusCode, raw, rerr)
				}
				return
			}
			if rerr == nil {
				t.Fatalf("status %d and a body that ended cleanly: %q", resp.StatusCode, raw)
			}
		})
	}
}

// idleClosingServer answers the first request of each keep-alive
// connection (its body quoted in "received") and closes the connection
// when a second one arrives on it, after writing onReuse: with nothing, a
// model server dropping an idle connection just as the client reuses it;
// with the start of an answer, one that took the request and failed.
func idleClosingServer(t *testing.T, onReuse string) (port int, conns *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns = new(atomic.Int32)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				got, _ := io.ReadAll(req.Body)
				// The answer shows what arrived, so that a replayed body is checked.
				answer := fmt.Sprintf(`{"id":"d","received":%q,"usage":{"prompt_tokens":4,"completion_tokens":1,"prompt_tokens_details":null}}`, got)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
				if _, err := br.Peek(1); err == nil && onReuse != "" { // the next request
					_, _ = io.WriteString(c, onReuse)
				}
			})
		}
	})
	return ln.Addr().(*net.TCPAddr).Port, conns
}

// TestDecodeLegRetriesStaleConnection: a decode leg of a request with an
// Idempotency-Key that fails on a reused connection before any answer
// goes once more on a new connection.
func TestDecodeLegRetriesStaleConnection(t *testing.T) {
	pre := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, prefillAnswer) })
	port, conns := idleClosingServer(t, "")
	_, url := startSidecar(t, testOptions(port, poolFile(t, pre.addr())))
	for i := range 3 {
		st, _, raw := post(t, url+"/v1/completions", map[string]string{"x-prefiller-host-port": pre.addr(), "Idempotency-Key": strconv.Itoa(i)},
			map[string]any{"model": "m", "prompt": "hi", "max_tokens": 1})
		if st != http.StatusOK || !strings.Contains(string(raw), `"cached_tokens":32`) {
			t.Fatalf("request %d: %d %s", i, st, raw)
		}
	}
	if n := conns.Load(); n < 3 {
		t.Fatalf("%d connections to the model server, want one per request", n)
	}
}

// TestRelayRetriesStaleConnection: a relayed request with an
// Idempotency-Key — body streamed from the client, not buffered — that
// fails on a reused connection before any answer is sent again on a new
// one with the same body; a body larger than what the sidecar keeps for a
// replay is not, and the client gets the vLLM-shaped 503. A GET, which
// net/http replays itself, needs no key.
func TestRelayRetriesStaleConnection(t *testing.T) {
	port, conns := idleClosingServer(t, "")
	o := testOptions(port, "")
	o.MaxRequestBodyBytes = 4 << 10
	_, url := startSidecar(t, o)
	send := func(method, path, body string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		var rd io.Reader
		if body != "" {
			// No length: the relay cannot know the body in advance.
			rd = io.MultiReader(strings.NewReader(body[:len(body)/2]), strings.NewReader(body[len(body)/2:]))
		}
		req, _ := http.NewRequestWithContext(ctx, method, url+path, rd)
		if method == http.MethodPost {
			req.Header.Set("Idempotency-Key", "k")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %s: reading the answer: %v", method, path, err)
		}
		return resp.StatusCode, string(raw)
	}
	for i := range 4 {
		body := fmt.Sprintf(`{"model":"m","prompt":"request %d %s","max_tokens":1}`, i, strings.Repeat("x", 100*i))
		st, raw := send(http.MethodPost, "/v1/completions", body)
		if want := strconv.Quote(body); st != http.StatusOK || !strings.Contains(raw, `"received":`+want) {
			t.Fatalf("request %d: %d %s, want 200 echoing %s", i, st, raw, want)
		}
	}
	if st, raw := send(http.MethodGet, "/v1/models", ""); st != http.StatusOK {
		t.Fatalf("GET after a stale connection: %d %s", st, raw)
	}
	if n := conns.Load(); n < 5 {
		t.Fatalf("%d connections to the model server for 5 requests, each on a stale one after the first", n)
	}
	before := conns.Load()
	st, raw := send(http.MethodPost, "/v1/completions", `{"prompt":"`+strings.Repeat("y", 8<<10)+`"}`)
	if st != http.StatusServiceUnavailable || !strings.Contains(raw, `"object":"error"`) {
		t.Fatalf("a body too large to replay: %d %s, want the decoder-down 503", st, raw)
	}
	if n := conns.Load() - before; n != 0 {
		t.Fatalf("%d new connections for a body that cannot be replayed, want none", n)
	}
}

// lateFINListener hands out connections whose Close takes effect only
// once the peer's next bytes arrive: the server has closed an idle
// connection, but its FIN is still in flight when the client reuses it.
type lateFINListener struct{ net.Listener }

func (l lateFINListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lateFINConn{Conn: c}, nil
}

type lateFINConn struct {
	net.Conn
	once sync.Once
}

func (c *lateFINConn) Close() error {
	c.once.Do(func() {
		go func() {
			_ = c.Conn.SetReadDeadline(time.Now().Add(testTimeout))
			var b [1]byte
			_, _ = c.Conn.Read(b[:])
			_ = c.Conn.Close()
		}()
	})
	return nil
}

// TestRelayRetriesIdleTimeout: a real `kvgate sim` behind a net/http
// server that closes keep-alive connections idle past its IdleTimeout.
// The next relayed request the sidecar sends on such a connection fails
// before any answer and, carrying an X-Idempotency-Key, is sent again on
// a new one: the client gets the sim's answer, streamed.
func TestRelayRetriesIdleTimeout(t *testing.T) {
	sim := startSim(t, vllmserver.RoleBoth)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{}, 16)
	srv := &http.Server{Handler: sim.Handler(), IdleTimeout: 20 * time.Millisecond, ReadHeaderTimeout: testTimeout,
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				closed <- struct{}{}
			}
		}}
	go func() { _ = srv.Serve(lateFINListener{ln}) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, url := startSidecar(t, testOptions(ln.Addr().(*net.TCPAddr).Port, ""))
	body := map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": "keep-alive connections go idle", "max_tokens": 3,
		"stream": true, "stream_options": map[string]any{"include_usage": true}}
	for i := range 3 {
		st, _, raw := post(t, url+"/v1/completions", map[string]string{"X-Idempotency-Key": strconv.Itoa(i)}, body)
		if st != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, st, raw)
		}
		if _, u := streamUsage(t, raw); u.CompletionTokens != 3 {
			t.Fatalf("request %d: usage %+v", i, u)
		}
		// The server closes the idle connection the request came on.
		select {
		case <-closed:
		case <-time.After(testTimeout):
			t.Fatal("the server did not close the idle connection")
		}
	}
}

// TestNoReplayOnceAnswered: a request whose upstream began an answer
// before the reused connection broke is not sent again (the upstream may
// have run it): the client gets the failure.
func TestNoReplayOnceAnswered(t *testing.T) {
	port, conns := idleClosingServer(t, "HTTP/1.1 200 OK\r\nContent-")
	_, url := startSidecar(t, testOptions(port, ""))
	body := map[string]any{"model": "m", "prompt": "hi", "max_tokens": 1}
	if st, _, raw := post(t, url+"/v1/completions", nil, body); st != http.StatusOK {
		t.Fatalf("first request: %d %s", st, raw)
	}
	st, _, raw := post(t, url+"/v1/completions", nil, body)
	if st != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"object":"error"`) {
		t.Fatalf("answer broken off on a reused connection: %d %s, want the decoder-down 503", st, raw)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections: the request was replayed", n)
	}
}
