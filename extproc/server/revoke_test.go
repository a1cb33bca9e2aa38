package server

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
)

// revokeDirector routes every request and hands out revocable exchanges:
// revoke is the channel their Revoked returns, closed by the test or, with
// revokeAtStart, by the exchange itself when the response starts (while
// the stream handles the response headers).
type revokeDirector struct {
	*testDirector
	revoke        chan struct{}
	revokeAtStart bool
}

type revokeExchange struct {
	testExchange
	d *revokeDirector
}

func (d *revokeDirector) HandleRequest(ctx context.Context, req *Request) (*Decision, Exchange, error) {
	dec, _, err := d.testDirector.HandleRequest(ctx, req)
	return dec, revokeExchange{testExchange{d.testDirector}, d}, err
}

func (x revokeExchange) Revoked() <-chan struct{} { return x.d.revoke }

func (x revokeExchange) ResponseStarted(ctx context.Context, head ResponseHead) {
	x.testExchange.ResponseStarted(ctx, head)
	if x.d.revokeAtStart {
		close(x.d.revoke)
	}
}

// TestRevocationEndsTheStreamAtOnce: a revoked request's stream ends with
// Aborted (Envoy then resets the request upstream) without the proxy's next
// message, which a model server prefilling a long prompt sends none of
// for seconds, and its exchange is released. The proxy here never sends
// another message: only the revocation can end the stream before the
// client's deadline.
func TestRevocationEndsTheStreamAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		// started: the response headers came before the revocation.
		started, atStart bool
	}{
		{name: "awaiting the response headers"},
		{name: "awaiting the first chunk", started: true},
		{name: "while handling the response headers", started: true, atStart: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &revokeDirector{testDirector: newTestDirector("10.0.0.1:8000"), revoke: make(chan struct{}), revokeAtStart: tc.atStart}
			e := envoytest.Open(t, startServer(t, New(d, Options{})))
			e.Send(envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models"))
			if e.Recv().GetRequestHeaders() == nil {
				t.Fatal("not routed")
			}
			if tc.started {
				e.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "text/event-stream"))
				if e.Recv().GetResponseHeaders() == nil {
					t.Fatal("want the response headers answered")
				}
			}
			if !tc.atStart {
				close(d.revoke)
			}
			if _, err := e.Stream.Recv(); status.Code(err) != codes.Aborted {
				t.Fatalf("revoked stream: %v, want Aborted", err)
			}
			if res := d.waitDone(t); res.Complete {
				t.Fatal("a revoked request's exchange reported complete")
			}
		})
	}
}

// TestUnrevokedStreamRuns: an exchange that is revocable but not revoked
// streams its response to the end.
func TestUnrevokedStreamRuns(t *testing.T) {
	d := &revokeDirector{testDirector: newTestDirector("10.0.0.1:8000"), revoke: make(chan struct{})}
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models"))
	e.Recv()
	e.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "text/event-stream"))
	e.Recv()
	for _, eos := range []bool{false, true} {
		e.Send(envoytest.ResponseBody([]byte("data: {}\n\n"), eos))
		if envoytest.StreamedChunk(t, e.Recv().GetResponseBody()).GetEndOfStream() != eos {
			t.Fatal("chunk's end of stream not passed on")
		}
	}
	if res := d.waitDone(t); !res.Complete {
		t.Fatal("an unrevoked response did not complete")
	}
}
