package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/testutil"
)

// holdHeader names a request the budget server holds before answering,
// until the test releases it or the request ends.
const holdHeader = "X-Test-Hold"

// budgetServer is a model server on loopback that reads each request's
// body whole and then acts on the words in it: "stale" closes a reused
// connection without an answer (an upstream that dropped it while idle),
// "cut" breaks the answer off after its header, "warm" waits until
// warmers requests are in at once (so that as many keep-alive connections
// exist). A request with holdHeader is held. Other requests are answered
// 200 with the body quoted in "received"; answers are chunked, so the
// sidecar has read one to its end, and put the connection back in its
// pool, before the client has it whole.
type budgetServer struct {
	srv     *httptest.Server
	dials   atomic.Int32
	warm    sync.WaitGroup
	mu      sync.Mutex
	arrived map[string]chan struct{} // by holdHeader, closed when the request is in
	release chan struct{}            // closed: every held request is answered
}

type connRequests struct{}

func newBudgetServer(t *testing.T, warmers int) *budgetServer {
	t.Helper()
	b := &budgetServer{arrived: map[string]chan struct{}{}, release: make(chan struct{})}
	b.warm.Add(warmers)
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.serve))
	b.srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connRequests{}, new(atomic.Int32))
	}
	b.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			b.dials.Add(1)
		}
	}
	b.srv.Start()
	t.Cleanup(b.srv.Close)
	return b
}

func (b *budgetServer) port() int { return b.srv.Listener.Addr().(*net.TCPAddr).Port }

// expect returns a channel closed once the request named id arrives.
func (b *budgetServer) expect(id string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := make(chan struct{})
	b.arrived[id] = c
	return c
}

func (b *budgetServer) serve(w http.ResponseWriter, r *http.Request) {
	nth := r.Context().Value(connRequests{}).(*atomic.Int32).Add(1)
	got, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	body := string(got)
	switch {
	case strings.Contains(body, "stale") && nth > 1:
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
		return
	case strings.Contains(body, "warm"):
		b.warm.Done()
		b.warm.Wait()
	}
	if id := r.Header.Get(holdHeader); id != "" {
		b.mu.Lock()
		if c, ok := b.arrived[id]; ok {
			close(c)
			delete(b.arrived, id)
		}
		b.mu.Unlock()
		select {
		case <-b.release:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush() // chunked from here on
	if strings.Contains(body, "cut") {
		_, _ = io.WriteString(w, `{"id":"d","choices":[`)
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"received": body})
}

// relay sends body to the sidecar's relayed path and returns the status
// and answer; an error is a failure that reached the client as such. The
// request carries an Idempotency-Key: the budget server's stale
// connection fails a request written whole, which only a keyed one may
// be replayed after.
func relay(ctx context.Context, url, body, hold string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Idempotency-Key", "budget")
	if hold != "" {
		req.Header.Set(holdHeader, hold)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), err
}

// prompt is a request body of exactly n bytes carrying words.
func prompt(words string, n int) string {
	head := `{"prompt":"` + words + " "
	return head + strings.Repeat("x", n-len(head)-2) + `"}`
}

// echoes is nil when the answer is a 200 quoting body.
func echoes(st int, raw, body string, err error) error {
	var got struct{ Received string }
	if err != nil || st != http.StatusOK || json.Unmarshal([]byte(raw), &got) != nil || got.Received != body {
		return fmt.Errorf("%d %.200s (%v), want 200 echoing the %d-byte body", st, raw, err, len(body))
	}
	return nil
}

// relayTimed is relay within testTimeout.
func relayTimed(url, body string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	return relay(ctx, url, body, "")
}

func wantEcho(t *testing.T, what, url, body string) {
	t.Helper()
	st, raw, err := relayTimed(url, body)
	if err := echoes(st, raw, body, err); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// wantNotReplayed: body meets a stale connection and gets the
// decoder-down 503, with no new connection dialled for a replay.
func wantNotReplayed(t *testing.T, what string, up *budgetServer, url, body string) {
	t.Helper()
	dials := up.dials.Load()
	st, raw, err := relayTimed(url, body)
	if err != nil || st != http.StatusServiceUnavailable || !strings.Contains(raw, `"object":"error"`) {
		t.Fatalf("%s: %d %s (%v), want the decoder-down 503", what, st, raw, err)
	}
	if n := up.dials.Load() - dials; n != 0 {
		t.Fatalf("%s: %d new connections, want none (no replay)", what, n)
	}
}

// TestReplayBufferSpent: while other requests hold the sidecar-wide
// replay buffer, a relayed request that does not fit is still relayed,
// only not kept: answered when its connection is sound, the decoder-down
// 503 without a replay when it is stale. Once the holder is answered the
// buffer is free again and the same request is replayed.
func TestReplayBufferSpent(t *testing.T) {
	up := newBudgetServer(t, 2)
	o := testOptions(up.port(), "")
	// A body reserves at most --max-request-body-bytes (1000): a 700-byte
	// holder and a 900-byte newcomer cannot both fit in 1500, and either
	// fits alone.
	o.MaxRequestBodyBytes, o.ReplayBufferBytes = 1000, 1500
	s, url := startSidecar(t, o)

	var warm sync.WaitGroup
	for i := range 2 { // two keep-alive connections in the pool
		body := prompt(fmt.Sprintf("warm %d", i), 100)
		warm.Go(func() {
			st, raw, err := relay(t.Context(), url, body, "")
			if err != nil || st != http.StatusOK {
				t.Errorf("warm-up: %d %s %v", st, raw, err)
			}
		})
	}
	warm.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// The holder's first attempt meets a stale connection; its replay, on
	// a new one, is held with its body still reserved.
	holder := prompt("stale", 700)
	in := up.expect("holder")
	held := make(chan error, 1)
	go func() {
		st, raw, err := relay(t.Context(), url, holder, "holder")
		held <- echoes(st, raw, holder, err)
	}()
	select {
	case <-in:
	case err := <-held:
		t.Fatalf("the holder ended before its replay was held: %v", err)
	}
	if u := s.replay.Used(); u < 700 {
		t.Fatalf("the held replay reserves %d bytes, want its 700", u)
	}

	wantEcho(t, "a request relayed without room to keep it", url, prompt("sound", 900))
	if n := promtestutil.ToFloat64(s.m.replayFull); n != 1 {
		t.Fatalf("replay_buffer_full_total %v, want 1", n)
	}

	wantNotReplayed(t, "stale connection, no room to keep the body", up, url, prompt("stale", 900))
	if n := promtestutil.ToFloat64(s.m.replayFull); n != 2 {
		t.Fatalf("replay_buffer_full_total %v, want 2", n)
	}

	close(up.release)
	if err := <-held; err != nil {
		t.Fatalf("the held request: %v", err)
	}
	if u := s.replay.Used(); u != 0 {
		t.Fatalf("%d bytes still reserved once every request was answered", u)
	}

	wantEcho(t, "a request on a new connection", url, prompt("sound again", 100)) // a keep-alive connection to go stale
	wantEcho(t, "the same request with the buffer free", url, prompt("stale", 900))
	if n := promtestutil.ToFloat64(s.m.replayFull); n != 2 || s.replay.Used() != 0 {
		t.Fatalf("after a replay: replay_buffer_full_total %v, %d bytes reserved", n, s.replay.Used())
	}
}

// TestReplayBufferOff: --replay-buffer-bytes 0 keeps no relayed body, so
// a stale connection's failure stands, and a sound one answers.
func TestReplayBufferOff(t *testing.T) {
	up := newBudgetServer(t, 0)
	o := testOptions(up.port(), "")
	o.ReplayBufferBytes = 0
	s, url := startSidecar(t, o)
	wantEcho(t, "a request on a new connection", url, prompt("stale", 200))
	wantNotReplayed(t, "stale connection, no replay buffer", up, url, prompt("stale", 200))
	if s.replay != nil || promtestutil.ToFloat64(s.m.replayFull) != 0 {
		t.Fatal("no replay buffer: none should exist, nor be counted as spent")
	}
}

// TestReplayBufferNoLeak: requests of every ending — answered, replayed,
// refused a replay, cut off after their header, cancelled by the client
// while held upstream or while still sending — run concurrently through
// a buffer smaller than their bodies together, and once they are over
// the buffer holds nothing.
func TestReplayBufferNoLeak(t *testing.T) {
	up := newBudgetServer(t, 0)
	o := testOptions(up.port(), "")
	o.MaxRequestBodyBytes, o.ReplayBufferBytes = 4<<10, 8<<10
	s, url := startSidecar(t, o)

	// Each kind is one request, run from a worker goroutine: it reports
	// what went wrong instead of failing the test itself.
	staleOK := func(what string, body string) error {
		st, raw, err := relayTimed(url, body)
		if err != nil || (st != http.StatusOK && st != http.StatusServiceUnavailable) {
			return fmt.Errorf("%s: %d %s (%v), want a replay or the 503", what, st, raw, err)
		}
		return nil
	}
	kinds := []func(id string) error{
		func(string) error { // answered
			body := prompt("sound", 3000)
			st, raw, err := relayTimed(url, body)
			return echoes(st, raw, body, err)
		},
		func(string) error { return staleOK("stale connection", prompt("stale", 2500)) },
		func(string) error { return staleOK("larger than a replay keeps", prompt("stale", 6000)) },
		func(string) error { // cut off after the header
			if st, raw, err := relayTimed(url, prompt("cut", 2000)); err == nil {
				return fmt.Errorf("an answer cut short arrived whole: %d %s", st, raw)
			}
			return nil
		},
		func(id string) error { // cancelled while held upstream
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			in := up.expect(id)
			done := make(chan error, 1)
			go func() {
				_, _, err := relay(ctx, url, prompt("sound", 2000), id)
				done <- err
			}()
			select {
			case <-in:
			case err := <-done:
				return fmt.Errorf("request %s ended before it was held: %v", id, err)
			}
			cancel()
			if err := <-done; err == nil {
				return fmt.Errorf("request %s was answered after its client gave up", id)
			}
			return nil
		},
		func(string) error { // cancelled while still sending its body
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pr, pw := io.Pipe()
			defer pw.Close() // unblocks the writer however the request ends
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", pr)
			if err != nil {
				return err
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			sent := make(chan struct{})
			go func() {
				_, _ = io.WriteString(pw, prompt("sound", 3000)[:1500])
				close(sent)
			}()
			select {
			case <-sent:
			case <-done:
				return errors.New("a half-sent request ended before its client gave up")
			}
			cancel()
			pw.CloseWithError(context.Canceled)
			<-done // however it ends: its client gave up
			return nil
		},
	}
	const workers, rounds = 4, 6
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds * len(kinds) {
				k := (i + w) % len(kinds)
				if err := kinds[k](fmt.Sprintf("w%d-%d", w, i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	testutil.WaitFor(t, "the replay buffer to be empty once every request ended", func() bool { return s.replay.Used() == 0 })
	if p := s.replay.Peak(); p == 0 {
		t.Fatal("no body was ever kept: the test did not exercise the buffer")
	}
	if p := s.replay.Peak(); p > o.ReplayBufferBytes {
		t.Fatalf("peak %d bytes kept, over the %d-byte buffer", p, o.ReplayBufferBytes)
	}
}
