package server

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
)

// testDirector routes every request to its endpoints (or fails with err)
// and records what it observes.
type testDirector struct {
	endpoints []string
	decide    func(req *Request) (*Decision, error) // overrides endpoints when set

	mu      sync.Mutex
	reqs    []*Request
	started []int
	chunks  [][]byte
	done    []ResponseSummary
	doneCh  chan ResponseSummary
	// doneCtxCancelled records a ResponseDone whose context was already
	// cancelled, which would break the director's cleanup.
	doneCtxCancelled bool
}

func newTestDirector(endpoints ...string) *testDirector {
	return &testDirector{endpoints: endpoints, doneCh: make(chan ResponseSummary, 16)}
}

func (d *testDirector) HandleRequest(ctx context.Context, req *Request) (*Decision, Exchange, error) {
	// The server drops the body once it is sent back; keep what was seen.
	seen := *req
	seen.Body = bytes.Clone(req.Body)
	d.mu.Lock()
	d.reqs = append(d.reqs, &seen)
	d.mu.Unlock()
	if d.decide != nil {
		dec, err := d.decide(req)
		if err != nil {
			return nil, nil, err
		}
		return dec, testExchange{d}, nil
	}
	return &Decision{Endpoints: d.endpoints}, testExchange{d}, nil
}

// testExchange records one request's response events in its director.
type testExchange struct{ d *testDirector }

func (x testExchange) ResponseStarted(ctx context.Context, head ResponseHead) {
	x.d.mu.Lock()
	defer x.d.mu.Unlock()
	x.d.started = append(x.d.started, head.Status)
}

func (x testExchange) ResponseChunk(ctx context.Context, chunk []byte) {
	x.d.mu.Lock()
	defer x.d.mu.Unlock()
	x.d.chunks = append(x.d.chunks, append([]byte(nil), chunk...))
}

func (x testExchange) ResponseDone(ctx context.Context, res ResponseSummary) {
	d := x.d
	d.mu.Lock()
	d.done = append(d.done, res)
	if ctx.Err() != nil {
		d.doneCtxCancelled = true
	}
	d.mu.Unlock()
	d.doneCh <- res
}

func (d *testDirector) request(t *testing.T) *Request {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.reqs) != 1 {
		t.Fatalf("director saw %d requests, want 1", len(d.reqs))
	}
	return d.reqs[0]
}

// waitDone returns the one ResponseDone of a test's request.
func (d *testDirector) waitDone(t *testing.T) ResponseSummary {
	t.Helper()
	select {
	case res := <-d.doneCh:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("ResponseDone was not called")
		return ResponseSummary{}
	}
}

// startServer serves s on a real loopback listener and returns a client.
func startServer(t testing.TB, s *Server, opts ...grpc.ServerOption) extprocv3.ExternalProcessorClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return envoytest.Dial(t, lis.Addr().String())
}
