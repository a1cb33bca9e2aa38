package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// scriptedStream plays a fixed message sequence into Process the way a gRPC
// stream would, then half-closes (io.EOF) or, if cancelAt is reached, fails
// like a reset stream.
type scriptedStream struct {
	grpc.ServerStream
	ctx      context.Context
	cancel   context.CancelFunc
	msgs     []*extprocv3.ProcessingRequest
	cancelAt int // index at which the client goes away; -1 for never
	next     int
	sent     int
}

func (s *scriptedStream) Context() context.Context { return s.ctx }

func (s *scriptedStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if s.next == s.cancelAt {
		s.cancel()
		return nil, s.ctx.Err()
	}
	if s.next >= len(s.msgs) {
		return nil, io.EOF
	}
	m := s.msgs[s.next]
	s.next++
	return m, nil
}

func (s *scriptedStream) Send(*extprocv3.ProcessingResponse) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	s.sent++
	return nil
}

// countingDirector decides from the request's facts so that the fuzzer
// reaches every outcome, and checks ResponseDone's contract.
type countingDirector struct {
	mu      sync.Mutex
	decided int
	done    int
	twice   bool
}

func (d *countingDirector) HandleRequest(ctx context.Context, req *Request) (*Decision, Exchange, error) {
	switch len(req.Body) % 4 {
	case 1:
		return nil, nil, inferr.New(inferr.ResourceExhausted, "busy")
	case 2:
		return nil, nil, errors.New("plain failure")
	}
	d.mu.Lock()
	d.decided++
	d.mu.Unlock()
	return &Decision{Endpoints: []string{"10.0.0.1:8000"}, TargetModel: req.ModelRewrite}, &countingExchange{d: d}, nil
}

// countingExchange counts its ResponseDone calls in the director.
type countingExchange struct {
	d    *countingDirector
	done bool
}

func (x *countingExchange) ResponseStarted(context.Context, ResponseHead) {}
func (x *countingExchange) ResponseChunk(context.Context, []byte)         {}

func (x *countingExchange) ResponseDone(context.Context, ResponseSummary) {
	x.d.mu.Lock()
	defer x.d.mu.Unlock()
	x.d.done++
	if x.done {
		x.d.twice = true
	}
	x.done = true
}

// messagesFrom turns fuzz bytes into an ext_proc message sequence: each
// message takes an opcode byte, a flags byte and, for bodies, a length
// byte and that many bytes of payload.
func messagesFrom(data []byte) (msgs []*extprocv3.ProcessingRequest, cancelAt int) {
	paths := []string{"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/responses"}
	types := []string{"application/json", "text/event-stream"}
	modes := []procmode.ProcessingMode_BodySendMode{procmode.ProcessingMode_FULL_DUPLEX_STREAMED,
		procmode.ProcessingMode_NONE, procmode.ProcessingMode_STREAMED, procmode.ProcessingMode_BUFFERED}
	cancelAt = -1
	take := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	payload := func() []byte {
		n := min(int(take()), len(data))
		p := data[:n]
		data = data[n:]
		return p
	}
	for len(data) > 0 && len(msgs) < 64 {
		op, flags := take(), take()
		eos := flags&1 != 0
		var m *extprocv3.ProcessingRequest
		switch op % 9 {
		case 0:
			kv := []string{":method", "POST", ":path", paths[int(flags>>1)%len(paths)]}
			if flags&8 != 0 {
				kv = append(kv, eppwire.HeaderModelRewrite, "other-model")
			}
			if flags&16 != 0 {
				kv = append(kv, "content-length", "40")
			}
			m = envoytest.RequestHeaders(eos, kv...)
			if flags&32 != 0 {
				envoytest.WithMetadata(m, eppwire.MetadataSubsetHint, eppwire.MetadataSubsetKey, structpb.NewStringValue("10.0.0.1"))
			}
		case 1:
			m = envoytest.RequestBody(payload(), eos)
		case 2:
			m = envoytest.RequestTrailers()
		case 3:
			m = envoytest.ResponseHeaders(eos, ":status", "200", "content-type", types[int(flags>>1)%len(types)])
		case 4:
			m = envoytest.ResponseBody(payload(), eos)
		case 5:
			m = envoytest.ResponseTrailers()
		case 6:
			m = &extprocv3.ProcessingRequest{}
		case 7:
			m = envoytest.WithModes(envoytest.RequestHeaders(eos, ":method", "POST", ":path", paths[0]),
				modes[int(flags>>1)%len(modes)], modes[int(flags>>3)%len(modes)])
		case 8:
			cancelAt = len(msgs)
		}
		if m != nil {
			m.ObservabilityMode = flags&128 != 0 && op%9 == 7
			msgs = append(msgs, m)
		}
	}
	return msgs, cancelAt
}

func FuzzProcess(f *testing.F) {
	body := []byte(`{"model":"m","prompt":"p"}`)
	seed := []byte{0, 0, 1, 1, byte(len(body))}
	seed = append(seed, body...)
	seed = append(seed, 3, 2, 4, 1, 5, 'd', 'a', 't', 'a', ':')
	f.Add(seed)
	f.Add([]byte{0, 1, 3, 0, 4, 0, 0, 5, 0})    // header-only, response, trailers
	f.Add([]byte{1, 1, 3, 'x', 'y', 'z', 0, 0}) // body before headers
	f.Add([]byte{7, 3, 2, 0, 3, 0, 8, 0})       // fast path, then cancel
	f.Add([]byte{0, 16, 1, 0, 2, 0, 6, 0})      // trailers end the body, empty message
	opts := Options{MaxRequestBodyBytes: 64, BodyChunkBytes: 7, Logger: slog.New(slog.DiscardHandler)}
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs, cancelAt := messagesFrom(data)
		d := &countingDirector{}
		s := New(d, opts)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st := &scriptedStream{ctx: ctx, cancel: cancel, msgs: msgs, cancelAt: cancelAt}
		errc := make(chan error, 1)
		go func() { errc <- s.Process(st) }()
		select {
		case <-errc:
		case <-time.After(10 * time.Second):
			t.Fatal("Process did not return")
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.done != d.decided || d.twice {
			t.Fatalf("%d decisions, %d ResponseDone calls (twice=%v)", d.decided, d.done, d.twice)
		}
	})
}
