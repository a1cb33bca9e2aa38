package server

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/bytebudget"
)

// repeatedHeaders is a request-headers message with name repeated n times
// (H4: one name 160,000 times cost the picker ~10 CPU-s when each repeat
// re-copied the joined value).
func repeatedHeaders(name string, n int) *extprocv3.ProcessingRequest {
	hm := envoytest.Headers(":method", "POST", ":path", "/v1/completions")
	for i := range n {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: name, RawValue: []byte(strconv.Itoa(i % 10))})
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: true},
	}}
}

// TestHeaderLimits (H4): header lists over the count or size limit are
// answered 431 before the director sees them; a list at the limits routes,
// with its repeats joined.
func TestHeaderLimits(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       Options
		msg        *extprocv3.ProcessingRequest
		wantStatus int // 0: routed
	}{
		{"160k repeats over the default count", Options{}, repeatedHeaders("x-a", 160_000), http.StatusRequestHeaderFieldsTooLarge},
		{"one over the count", Options{MaxHeaders: 10}, repeatedHeaders("x-a", 9), http.StatusRequestHeaderFieldsTooLarge},
		{"at the count", Options{MaxHeaders: 10}, repeatedHeaders("x-a", 8), 0},
		{"over the bytes", Options{MaxHeaderBytes: 1000},
			envoytest.RequestHeaders(true, ":method", "POST", ":path", "/v1/completions", "x-big", strings.Repeat("a", 1000)),
			http.StatusRequestHeaderFieldsTooLarge},
		{"raised limits take 160k repeats", Options{MaxHeaders: 200_000, MaxHeaderBytes: 4 << 20}, repeatedHeaders("x-a", 160_000), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDirector("10.0.0.1:8000")
			e := envoytest.Open(t, startServer(t, New(d, tc.opts), grpc.MaxRecvMsgSize(16<<20)))
			e.Send(tc.msg)
			r := e.Recv()
			if tc.wantStatus != 0 {
				envoytest.ImmediateError(t, r, tc.wantStatus, inferr.BadRequest)
				d.mu.Lock()
				defer d.mu.Unlock()
				if len(d.reqs) != 0 {
					t.Fatal("director saw a request over the header limits")
				}
				return
			}
			if r.GetRequestHeaders() == nil {
				t.Fatalf("want a routing decision, got %v", r)
			}
		})
	}
}

func TestHeaderMapJoinsRepeats(t *testing.T) {
	hm := envoytest.Headers("Accept", "a", "x-b", "1", "accept", "b", "ACCEPT", "c")
	m, err := headerMap(hm, headerLimits{count: 10, bytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if m["accept"] != "a,b,c" || m["x-b"] != "1" || len(m) != 2 {
		t.Fatalf("joined %v", m)
	}
	if _, err := headerMap(hm, headerLimits{count: 3, bytes: 1000}); !errors.Is(err, errHeadersTooLarge) {
		t.Fatalf("over the count: %v", err)
	}
}

// TestBodyBudget: bodies of all streams together are bounded; a body that
// does not fit is refused with 503 and the budget is returned when a
// stream ends, so later requests fit again.
func TestBodyBudget(t *testing.T) {
	budget := bytebudget.New(1000)
	d := newTestDirector("10.0.0.1:8000")
	c := startServer(t, New(d, Options{BodyBudget: budget}))
	held := envoytest.Open(t, c)
	held.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
	held.Send(envoytest.RequestBody([]byte(strings.Repeat("a", 800)), false))

	// Wait until the held stream's bytes are reserved (the stream runs on
	// its own goroutine).
	for i := 0; budget.Used() < 800; i++ {
		if i > 1000 {
			t.Fatalf("held stream reserved %d bytes", budget.Used())
		}
		time.Sleep(5 * time.Millisecond)
	}
	second := envoytest.Open(t, c)
	second.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
	second.Send(envoytest.RequestBody([]byte(strings.Repeat("b", 300)), true))
	envoytest.ImmediateError(t, second.Recv(), http.StatusServiceUnavailable, inferr.ServiceUnavailable)

	held.Cancel()
	for i := 0; budget.Used() != 0; i++ {
		if i > 1000 {
			t.Fatalf("budget not returned: %d held", budget.Used())
		}
		time.Sleep(5 * time.Millisecond)
	}
	third := envoytest.Open(t, c)
	third.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
	third.Send(envoytest.RequestBody([]byte(`{"model":"m","prompt":"`+strings.Repeat("c", 300)+`"}`), true))
	if third.Recv().GetRequestHeaders() == nil {
		t.Fatal("a body that fits after the release was not routed")
	}
	if budget.Peak() > budget.Limit() {
		t.Fatalf("peak %d over the limit %d", budget.Peak(), budget.Limit())
	}
}

// TestIdleStreams: a stalled upload and a routed stream that never sends
// its response are both ended, and the routed one's exchange is released
// (held streams must not keep in-flight counts up forever).
func TestIdleStreams(t *testing.T) {
	d := newTestDirector("10.0.0.1:8000")
	budget := bytebudget.New(1 << 20)
	c := startServer(t, New(d, Options{BodyBudget: budget,
		RequestIdleTimeout: 100 * time.Millisecond, ResponseIdleTimeout: 100 * time.Millisecond}))

	stalled := envoytest.Open(t, c)
	stalled.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
	stalled.Send(envoytest.RequestBody([]byte(`{"model":"m","prompt":"`), false))
	if _, err := stalled.Stream.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("stalled upload: %v, want DeadlineExceeded", err)
	}

	routed := envoytest.Open(t, c)
	routed.Send(envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models"))
	if routed.Recv().GetRequestHeaders() == nil {
		t.Fatal("not routed")
	}
	if _, err := routed.Stream.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("held routed stream: %v, want DeadlineExceeded", err)
	}
	if res := d.waitDone(t); res.Complete {
		t.Fatal("an idle stream's exchange reported complete")
	}
	if budget.Used() != 0 {
		t.Fatalf("idle streams still hold %d body bytes", budget.Used())
	}
}

// TestActiveStreamOutlivesIdleTimeout: the idle timeout is per message, so
// a body trickling in faster than it is not cut. The gaps are a
// twenty-fifth of the timeout, so that a loaded machine's scheduling
// delays do not stretch one past it; the sleeps alone (a lower bound)
// make the whole upload longer than the timeout.
func TestActiveStreamOutlivesIdleTimeout(t *testing.T) {
	const timeout = time.Second
	d := newTestDirector("10.0.0.1:8000")
	c := startServer(t, New(d, Options{RequestIdleTimeout: timeout}))
	e := envoytest.Open(t, c)
	e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions"))
	body := `{"model":"m","prompt":"` + strings.Repeat("x", 20) + `"}`
	gap := timeout / 25
	if time.Duration(len(body))*gap <= timeout {
		t.Fatalf("%d chunks %v apart do not outlast the %v timeout", len(body), gap, timeout)
	}
	for i := range len(body) {
		time.Sleep(gap)
		e.Send(envoytest.RequestBody([]byte(body[i:i+1]), i == len(body)-1))
	}
	if e.Recv().GetRequestHeaders() == nil {
		t.Fatal("a steadily arriving body was not routed")
	}
}
