package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/internal/bytebudget"
	"github.com/kvgate/kvgate/internal/testutil"
)

// client has a hang guard: a request that the gateway leaves hanging fails
// the test instead of stalling it.
var client = &http.Client{Timeout: 10 * time.Second}

// TestHeaderLimits (H4, gateway side): header floods are refused with 431
// before anything reaches the picker or an upstream.
func TestHeaderLimits(t *testing.T) {
	up := newUpstream(t, nil)
	picker := &testPicker{endpoints: up.addr()}
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker)})
	many := map[string]string{}
	for i := range 101 {
		many["x-h"+strconv.Itoa(i)] = "v"
	}
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    int
	}{
		{"101 headers", many, http.StatusRequestHeaderFieldsTooLarge},
		{"61 KiB value", map[string]string{"x-big": strings.Repeat("a", 61<<10)}, http.StatusRequestHeaderFieldsTooLarge},
		{"1 MiB value", map[string]string{"x-big": strings.Repeat("a", 1<<20)}, http.StatusRequestHeaderFieldsTooLarge},
		{"within the limits", map[string]string{"x-big": strings.Repeat("a", 50<<10)}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _ := post(t, client, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, tc.headers)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
	select {
	case saw := <-up.got:
		if len(saw.header.Get("x-big")) != 50<<10 {
			t.Fatal("an over-limit request reached the upstream")
		}
	default:
		t.Fatal("the request within the limits did not reach the upstream")
	}
}

// TestRepeatedHeaderFlood: one name repeated many times (the H4 request)
// is counted per value, not per name.
func TestRepeatedHeaderFlood(t *testing.T) {
	up := newUpstream(t, nil)
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, &testPicker{endpoints: up.addr()})})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	for range 5000 {
		req.Header.Add("x-a", "1")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// TestBlockedPaths: model servers' admin endpoints are not reachable
// through the gateway by default, however the path is spelled; the list is
// configurable.
func TestBlockedPaths(t *testing.T) {
	up := newUpstream(t, nil)
	picker := &testPicker{endpoints: up.addr()}
	addr := startPicker(t, picker)
	def := startGateway(t, gateway.Config{ExtProc: addr})
	open := startGateway(t, gateway.Config{ExtProc: addr, BlockedPaths: []string{}})
	for _, tc := range []struct {
		url, path string
		want      int
	}{
		{def, "/reset_prefix_cache", http.StatusForbidden},
		{def, "/metrics", http.StatusForbidden},
		{def, "/reset_prefix_cache/", http.StatusForbidden},
		{def, "/./metrics", http.StatusForbidden},
		{def, "/v1//../reset_prefix_cache", http.StatusForbidden},
		{def, "/v1/../reset_prefix_cache", http.StatusForbidden},
		{def, "/%72eset_prefix_cache", http.StatusForbidden},
		{def, "/sleep?level=1", http.StatusForbidden},
		{def, "/v1/completions", http.StatusOK},
		{open, "/reset_prefix_cache", http.StatusOK},
	} {
		req, err := http.NewRequest(http.MethodPost, tc.url+"/x", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.URL.Opaque = tc.path // sent as written, not cleaned by the client
		if p, q, ok := strings.Cut(tc.path, "?"); ok {
			req.URL.Opaque, req.URL.RawQuery = p, q
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s via %s: status %d, want %d", tc.path, tc.url, resp.StatusCode, tc.want)
		}
	}
}

// TestClientRewriteHeadersStripped: a client cannot choose the served model
// with the rewrite headers unless the gateway is told to trust them.
func TestClientRewriteHeadersStripped(t *testing.T) {
	up := newUpstream(t, nil)
	for _, trust := range []bool{false, true} {
		picker := &testPicker{endpoints: up.addr()}
		url := startGateway(t, gateway.Config{ExtProc: startPicker(t, picker), TrustClientRewrite: trust})
		post(t, client, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{
			"x-gateway-model-name-rewrite": "expensive", "x-llm-d-model-name-rewrite": "expensive",
		})
		saw := picker.next(t)
		for _, h := range []string{"x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite"} {
			if _, ok := saw.headers[h]; ok != trust {
				t.Errorf("trust=%v: %s reached the picker: %v", trust, h, ok)
			}
		}
	}
}

// TestFailOpenSpreads: with the picker down, fail-open traffic spreads over
// every fallback instead of all going to the first.
func TestFailOpenSpreads(t *testing.T) {
	var fallbacks []string
	ups := make([]*upstream, 3)
	for i := range ups {
		ups[i] = newUpstream(t, nil)
		fallbacks = append(fallbacks, ups[i].addr())
	}
	url := startGateway(t, gateway.Config{ExtProc: testutil.RefusedAddr(t), FailureModeAllow: true, Fallback: fallbacks})
	for range 30 {
		if resp, _ := post(t, client, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	for i, u := range ups {
		if n := len(u.got); n != 10 {
			t.Errorf("fallback %d took %d of 30 requests, want 10", i, n)
		}
	}
}

// TestPickerReconnect (Medium): during a picker outage the gateway keeps
// retrying at the bounded back-off (gRPC's default grows past 4 s within
// 10 s and to 120 s later), and once the picker is back it routes again.
//
// The bound is checked against a clock that runs as slow as the machine:
// a second gateway whose back-off keeps growing (the same base and
// multiplier, a 30 s bound it does not reach here) tries its own dead
// picker port beside the first. Its gaps grow 1.6-fold per attempt; the
// bounded one's stop at PickerReconnectMax, so within one of the growing
// gateway's late gaps the bounded gateway makes many attempts where an
// unbounded one would make about one. A loaded machine stretches both.
func TestPickerReconnect(t *testing.T) {
	const bound = 100 * time.Millisecond
	bounded, growing := newPickerPort(t), newPickerPort(t)
	up := newUpstream(t, nil)
	url := startGateway(t, gateway.Config{ExtProc: bounded.ln.Addr().String(), ExtProcTimeout: 200 * time.Millisecond, PickerReconnectMax: bound})
	ref := startGateway(t, gateway.Config{ExtProc: growing.ln.Addr().String(), ExtProcTimeout: 200 * time.Millisecond,
		PickerReconnectMax: 30 * time.Second})

	// Requests keep both gateways' channels out of idle; they must fail.
	awaitDown := func(what string, cond func() bool) {
		t.Helper()
		for guard := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
			for _, u := range []string{url, ref} {
				if resp, _ := post(t, client, u+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil); resp.StatusCode == http.StatusOK {
					t.Fatal("routed with the picker down")
				}
			}
			if time.Now().After(guard) {
				t.Fatalf("timed out waiting for %s (%d and %d attempts)", what, bounded.count(), growing.count())
			}
		}
	}
	// The growing gateway's gap after its 8th attempt (retry 7: 0.1 s ×
	// 1.6^7 ≈ 2.7 s, ±20% jitter) spans 18 or more of the bounded
	// gateway's gaps (≤ 0.12 s each); an unbounded one would make 0–2.
	const nth = 8
	awaitDown("the growing gateway's 8th attempt", func() bool { return growing.count() >= nth })
	from := bounded.count()
	awaitDown("the growing gateway's 9th attempt", func() bool { return growing.count() >= nth+1 })
	if in := bounded.count() - from; in < 4 {
		t.Fatalf("%d reconnect attempts while a growing back-off waited once (after its attempt %d): back-off not bounded by %v",
			in, nth, bound)
	}

	bounded.serve(t, &testPicker{endpoints: up.addr()})
	// Several back-off periods; the bound is a hang guard, long enough for
	// a loaded machine's reconnect and the first picker reply.
	for back := time.Now().Add(20 * time.Second); ; {
		resp, _ := post(t, client, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(back) {
			t.Fatalf("still status %d 20 s after the picker came back", resp.StatusCode)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pickerPort is a picker's listener the test holds from the outage to the
// recovery, so no other process can take the port in between. While down
// it accepts each connection and closes it at once (a picker port that
// refuses to speak), counting the attempt; once up it hands connections to
// the gRPC server serving on it.
type pickerPort struct {
	ln       net.Listener
	mu       sync.Mutex
	attempts int
	up       *handoff // nil while down
	closed   chan struct{}
}

func newPickerPort(t *testing.T) *pickerPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pickerPort{ln: ln, closed: make(chan struct{})}
	t.Cleanup(func() { ln.Close(); <-p.closed })
	go p.run()
	return p
}

func (p *pickerPort) run() {
	defer close(p.closed)
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		up := p.up
		if up == nil {
			p.attempts++
		}
		p.mu.Unlock()
		if up == nil {
			_ = c.Close()
			continue
		}
		select {
		case up.conns <- c:
		case <-up.done: // the server stopped; the gateway still redials
			_ = c.Close()
		}
	}
}

func (p *pickerPort) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attempts
}

// serve brings picker up on the port.
func (p *pickerPort) serve(t *testing.T, picker *testPicker) {
	picker.seen = make(chan pickerSaw, 64)
	h := &handoff{conns: make(chan net.Conn), closed: p.closed, done: make(chan struct{}), addr: p.ln.Addr()}
	p.mu.Lock()
	p.up = h
	p.mu.Unlock()
	s := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(s, picker)
	go func() { _ = s.Serve(h) }()
	t.Cleanup(s.Stop)
}

// handoff is the net.Listener of the connections a pickerPort accepted.
type handoff struct {
	conns  chan net.Conn
	closed chan struct{} // the pickerPort's listener closed
	done   chan struct{}
	once   sync.Once
	addr   net.Addr
}

func (h *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.closed:
	case <-h.done:
	}
	return nil, net.ErrClosed
}

func (h *handoff) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

func (h *handoff) Addr() net.Addr { return h.addr }

// TestPickerStreamOpenTimeout (left open): a picker at its stream limit
// makes opening a stream wait for quota; the open is bounded by the
// message timeout.
func TestPickerStreamOpenTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.MaxConcurrentStreams(1))
	picker := &testPicker{stall: true, seen: make(chan pickerSaw, 64), opened: make(chan struct{}, 1)}
	extprocv3.RegisterExternalProcessorServer(s, picker)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)

	// A first request whose upload stalls holds the connection's only
	// stream.
	url := startGateway(t, gateway.Config{ExtProc: ln.Addr().String(), ExtProcTimeout: 300 * time.Millisecond})
	body := &stallingBody{first: []byte(`{"model":"m",`), sent: make(chan struct{}), release: make(chan struct{})}
	defer close(body.release)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", body)
		req.ContentLength = 100
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-body.sent
	<-picker.opened // the held stream is open
	resp, _ := post(t, client, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504", resp.StatusCode)
	}
}

// stallingBody sends first, closes sent, then blocks until release closes.
type stallingBody struct {
	first   []byte
	sent    chan struct{}
	release chan struct{}
	done    bool
}

func (b *stallingBody) Read(p []byte) (int, error) {
	if !b.done {
		b.done = true
		close(b.sent)
		return copy(p, b.first), nil
	}
	<-b.release
	return 0, io.ErrUnexpectedEOF
}

// TestStalledUpload: an upload that stops sending is answered 408 after
// the body idle timeout, whichever path holds it (the filter's buffer or the
// stream to the picker), and its bytes go back to the budget.
func TestStalledUpload(t *testing.T) {
	up := newUpstream(t, nil)
	for _, tc := range []struct {
		name   string
		filter bool
		mode   gateway.BodyMode
	}{
		{"to the picker", false, gateway.FullDuplexStreamed},
		{"in the filter's buffer", true, gateway.None},
	} {
		t.Run(tc.name, func(t *testing.T) {
			budget := bytebudget.New(1 << 30)
			cfg := gateway.Config{ExtProc: startPicker(t, &testPicker{endpoints: up.addr()}),
				RequestBodyMode: tc.mode, BodyIdleTimeout: 200 * time.Millisecond, BodyBudget: budget}
			if tc.filter {
				cfg = withFilter(t, cfg, `{}`)
			}
			url := startGateway(t, cfg)
			status := rawStalledPost(t, url, 1000, []byte(`{"model":"m","prompt":"`))
			if status != http.StatusRequestTimeout {
				t.Fatalf("status %d, want 408", status)
			}
			if budget.Used() != 0 {
				t.Fatalf("%d bytes still held", budget.Used())
			}
		})
	}
}

// rawStalledPost announces length bytes, sends sent, stops, and returns the
// status the gateway answers with.
func rawStalledPost(t *testing.T, url string, length int, sent []byte) int {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // hang guard
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", length)
	_, _ = c.Write(sent)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled upload: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestBodyBudgetRefuses: while stalled uploads hold the budget, a new body
// that does not fit is refused with 503, and fits again once they are gone.
func TestBodyBudgetRefuses(t *testing.T) {
	up := newUpstream(t, nil)
	budget := bytebudget.New(200 << 10)
	// The idle timeout releases the stalled uploads; until then they must
	// hold the budget while the big request arrives, a loaded machine's
	// delays included.
	url := startGateway(t, withFilter(t, gateway.Config{ExtProc: startPicker(t, &testPicker{endpoints: up.addr()}),
		RequestBodyMode: gateway.None, BodyBudget: budget, BodyIdleTimeout: 5 * time.Second}, `{}`))
	// Two stalled uploads of 100 KiB hold the budget (each buffer grows in
	// steps: 64 KiB, then 128 KiB).
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { rawStalledPost(t, url, 200<<10, []byte(strings.Repeat("a", 100<<10))) })
	}
	for deadline := time.Now().Add(5 * time.Second); budget.Used() < 128<<10; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stalled uploads hold %d bytes", budget.Used())
		}
	}
	big := `{"model":"m","prompt":"` + strings.Repeat("b", 100<<10) + `"}`
	resp, _ := post(t, client, url+"/v1/completions", big, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("over budget: status %d, want 503", resp.StatusCode)
	}
	wg.Wait() // the stalled uploads timed out
	if resp, _ := post(t, client, url+"/v1/completions", big, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the release: status %d", resp.StatusCode)
	}
	if budget.Peak() > budget.Limit() {
		t.Fatalf("peak %d over the budget %d", budget.Peak(), budget.Limit())
	}
}

// TestUpstreamIdleTimeout (Low): an upstream that accepts the request and
// never answers is given up on after the idle timeout.
func TestUpstreamIdleTimeout(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-block })
	url := startGateway(t, gateway.Config{ExtProc: startPicker(t, &testPicker{endpoints: up.addr()}),
		UpstreamIdleTimeout: 200 * time.Millisecond})
	resp, _ := post(t, client, url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504", resp.StatusCode)
	}
}

// TestDefaultsBound: the defaults bound every wait and buffer.
func TestDefaultsBound(t *testing.T) {
	o := gateway.DefaultOptions()
	if o.UpstreamIdleTimeout <= 0 || o.BodyIdleTimeout <= 0 || o.BodyBudgetBytes <= 0 ||
		o.MaxRequestHeaders <= 0 || o.MaxRequestHeaderBytes <= 0 || o.BlockedPaths == "" || o.TrustClientRewrite {
		t.Fatalf("unbounded defaults: %+v", o)
	}
}

// TestTrailersEndTheStream (left open): upstream trailers go to the real
// picker in place of an end-of-stream body chunk, and reach the client.
func TestTrailersEndTheStream(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "x-checksum")
		_, _ = io.WriteString(w, "part one;")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "part two")
		w.Header().Set("x-checksum", "abc")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	d := &oneDirector{endpoint: up.addr(), done: make(chan server.ResponseSummary, 1)}
	server.New(d, server.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Register(g)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	url := startGateway(t, gateway.Config{ExtProc: ln.Addr().String()})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "part one;part two" || resp.Trailer.Get("x-checksum") != "abc" {
		t.Fatalf("body %q err %v trailer %v", b, err, resp.Trailer)
	}
	select {
	case res := <-d.done:
		if !res.Complete {
			t.Fatal("picker saw the response incomplete")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("picker never saw the response end")
	}
}

// oneDirector routes everything to one endpoint.
type oneDirector struct {
	endpoint string
	done     chan server.ResponseSummary
}

func (d *oneDirector) HandleRequest(context.Context, *server.Request) (*server.Decision, server.Exchange, error) {
	return &server.Decision{Endpoints: []string{d.endpoint}}, oneExchange{d}, nil
}

type oneExchange struct{ d *oneDirector }

func (oneExchange) ResponseStarted(context.Context, server.ResponseHead) {}
func (oneExchange) ResponseChunk(context.Context, []byte)                {}
func (x oneExchange) ResponseDone(_ context.Context, res server.ResponseSummary) {
	select {
	case x.d.done <- res:
	default:
	}
}

// probeBody watches the reads of a request body around the handler's
// return: a read in progress when the handler returns, or one started
// after, is counted in late.
type probeBody struct {
	r        io.ReadCloser
	active   atomic.Int32
	returned atomic.Bool
	late     *atomic.Int32
}

func (b *probeBody) Read(p []byte) (int, error) {
	if b.returned.Load() {
		b.late.Add(1)
	}
	b.active.Add(1)
	defer b.active.Add(-1)
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		// An interrupted read lingers a moment before it returns, so that a
		// handler that does not wait for its reader returns while the
		// read is still in progress, every time.
		time.Sleep(50 * time.Millisecond)
	}
	return n, err
}

func (b *probeBody) Close() error { return b.r.Close() }

// TestBodySenderStopsBeforeHandlerReturns (left open: "the body sender
// reading after the handler returned"): the picker answers on the headers
// while the client's body is still on its way; the goroutine streaming that
// body to the picker is blocked reading it, and the handler must interrupt
// it and wait for it before returning (net/http forbids reading a request
// body after that).
func TestBodySenderStopsBeforeHandlerReturns(t *testing.T) {
	up := newUpstream(t, nil)
	picker := &testPicker{endpoints: up.addr(), immediate: http.StatusTooManyRequests, decideOnHeaders: true}
	budget := bytebudget.New(1 << 30)
	ctx, cancel := context.WithCancel(context.Background())
	g, err := gateway.New(ctx, gateway.Config{ExtProc: startPicker(t, picker), BodyBudget: budget,
		BodyIdleTimeout: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var late, inProgress, served atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pb := &probeBody{r: r.Body, late: &late}
		r.Body = pb
		g.ServeHTTP(w, r)
		// net/http finishes with the body it gave: a body of another type
		// it drains after the handler (up to 256 KiB, waiting on the
		// stalled client for as long as the last read's deadline), where
		// its own, with 1 MiB unread, ends the connection at once.
		r.Body = pb.r
		pb.returned.Store(true)
		inProgress.Add(pb.active.Load())
		served.Add(1)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gateway.Serve(ctx, ln, h) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		g.Close()
	}()

	for i := range 5 {
		// The body is announced, begun, and then stalls: the sender is
		// inside a read of it when the immediate response comes.
		status := rawStalledPost(t, "http://"+ln.Addr().String(), 1<<20, []byte(`{"model":"m","prompt":"`))
		if status != http.StatusTooManyRequests {
			t.Fatalf("request %d: status %d, want 429", i, status)
		}
	}
	for i := 0; served.Load() < 5; i++ { // the handlers end after the answers
		if i > 1000 {
			t.Fatalf("%d of 5 handlers returned", served.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // room for a late read to show
	if n := inProgress.Load(); n != 0 {
		t.Errorf("%d handler(s) returned while the body sender was still reading the client's body", n)
	}
	if n := late.Load(); n != 0 {
		t.Errorf("the client's body was read %d time(s) after the handler returned", n)
	}
	if budget.Used() != 0 {
		t.Errorf("%d body bytes still held", budget.Used())
	}
}

// TestRevocationAbortsTheUpstream: a request the picker revokes while its
// model server is still prefilling is cut through the proxy at once, before
// the response headers as after them: the upstream request is cancelled,
// which is what makes a model server abort it, and the client is answered
// 500 or its response ends short. The picker learns of no message to act
// on: only the end of its stream can do it.
func TestRevocationAbortsTheUpstream(t *testing.T) {
	for _, tc := range []struct {
		name string
		// headers: the upstream sends its response headers before it
		// prefills, as a streaming server does.
		headers bool
	}{{"before the response headers", false}, {"before the first chunk", true}} {
		t.Run(tc.name, func(t *testing.T) {
			prefilling, cancelled := make(chan struct{}), make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.headers {
					w.Header().Set("content-type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
				}
				close(prefilling)
				<-r.Context().Done()
				close(cancelled)
			})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			g := grpc.NewServer()
			d := &revocableDirector{oneDirector: oneDirector{endpoint: up.addr(), done: make(chan server.ResponseSummary, 1)},
				revoke: make(chan struct{}), started: make(chan struct{})}
			server.New(d, server.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Register(g)
			go func() { _ = g.Serve(ln) }()
			t.Cleanup(g.Stop)
			url := startGateway(t, gateway.Config{ExtProc: ln.Addr().String()})

			type answer struct {
				status int
				err    error
			}
			read := make(chan answer, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
				resp, err := client.Do(req)
				if err != nil {
					read <- answer{err: err}
					return
				}
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				read <- answer{resp.StatusCode, err}
			}()
			await := func(ch chan struct{}, what string) {
				t.Helper()
				select {
				case <-ch:
				case <-time.After(10 * time.Second):
					t.Fatal(what)
				}
			}
			await(prefilling, "the upstream never got the request")
			if tc.headers {
				await(d.started, "the picker never saw the response start")
			}
			close(d.revoke)
			await(cancelled, "the revoked request still runs upstream")
			a := <-read
			switch {
			case tc.headers && a.err == nil:
				t.Fatal("the revoked response ended as if complete")
			case !tc.headers && (a.err != nil || a.status != http.StatusInternalServerError):
				t.Fatalf("revoked before its headers: status %d, err %v; want 500", a.status, a.err)
			}
			if res := <-d.done; res.Complete {
				t.Fatal("picker saw the revoked response complete")
			}
		})
	}
}

// revocableDirector's exchanges are revoked when revoke closes; started
// closes when the response starts.
type revocableDirector struct {
	oneDirector
	revoke, started chan struct{}
}

func (d *revocableDirector) HandleRequest(context.Context, *server.Request) (*server.Decision, server.Exchange, error) {
	return &server.Decision{Endpoints: []string{d.endpoint}}, revocableExchange{oneExchange{&d.oneDirector}, d}, nil
}

type revocableExchange struct {
	oneExchange
	d *revocableDirector
}

func (x revocableExchange) Revoked() <-chan struct{} { return x.d.revoke }
func (x revocableExchange) ResponseStarted(context.Context, server.ResponseHead) {
	close(x.d.started)
}
