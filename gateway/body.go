package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// chunkSize bounds one body message to the picker; GIE re-sends bodies in
// chunks of at most ~62,000 bytes, so this keeps both directions alike.
const chunkSize = 62_000

// bodySender streams the client's request body to the picker
// (FULL_DUPLEX_STREAMED). Until the picker's decision it keeps a copy,
// bounded by max, so that a picker failure can still fail open with the
// whole body.
type bodySender struct {
	p    *processor
	src  io.Reader
	max  int
	done chan struct{}
	// sendingSince is when the send in progress began (unix ns), 0
	// between sends: a send blocked for long means the picker stopped
	// reading, while time spent reading the client is the client's.
	sendingSince atomic.Int64

	mu        sync.Mutex // guards the fields below
	retaining bool
	retained  []byte
	overflow  bool
}

func startBodySender(ctx context.Context, p *processor, src io.Reader, max int) *bodySender {
	s := &bodySender{p: p, src: src, max: max, done: make(chan struct{}), retaining: true}
	go s.run(ctx)
	return s
}

func (s *bodySender) run(ctx context.Context) {
	defer close(s.done)
	buf := make([]byte, chunkSize)
	for ctx.Err() == nil {
		n, err := s.src.Read(buf)
		if n > 0 {
			s.keep(buf[:n])
			// Send serializes before returning, so buf may be reused.
			if s.send(requestBody(buf[:n], false)) != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			_ = s.send(requestBody(nil, true))
			return
		}
		if err != nil {
			// The client went away; the request context ends with it.
			return
		}
	}
}

func (s *bodySender) send(m *extprocv3.ProcessingRequest) error {
	s.sendingSince.Store(time.Now().UnixNano())
	defer s.sendingSince.Store(0)
	return s.p.send(m)
}

// stalledFor is how long the send in progress has been blocked.
func (s *bodySender) stalledFor() time.Duration {
	since := s.sendingSince.Load()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

func requestBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos},
	}}
}

func (s *bodySender) keep(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.retaining {
		return
	}
	if len(s.retained)+len(b) > s.max {
		s.retaining, s.retained, s.overflow = false, nil, true
		return
	}
	s.retained = append(s.retained, b...)
}

// decided drops the copy: the picker answered and owns the body now.
func (s *bodySender) decided() {
	s.mu.Lock()
	s.retaining, s.retained = false, nil
	s.mu.Unlock()
}

// abandon waits for the sender to stop (the processor must be closed) and
// returns the whole body again, or false when the copy overflowed.
func (s *bodySender) abandon() (io.Reader, bool) {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overflow {
		return nil, false
	}
	return io.MultiReader(bytes.NewReader(s.retained), s.src), true
}

// errUpstreamDone ends a body pump whose upstream stopped reading.
var errUpstreamDone = errors.New("upstream finished before the request body")

// bodyPump turns the picker's streamed request-body responses into the
// upstream request body. It is the only reader of the processor's
// messages until it sees end of stream.
type bodyPump struct {
	reader *io.PipeReader
	done   chan struct{}
	err    error // written before done closes
}

func startBodyPump(ctx context.Context, p *processor) *bodyPump {
	pr, pw := io.Pipe()
	b := &bodyPump{reader: pr, done: make(chan struct{})}
	go b.run(ctx, p, pw)
	return b
}

func (b *bodyPump) run(ctx context.Context, p *processor, pw *io.PipeWriter) {
	defer close(b.done)
	for {
		m, err := p.next(ctx)
		if err != nil {
			b.err = err
			pw.CloseWithError(err)
			return
		}
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			b.err = fmt.Errorf("%w: want a streamed request body, got %T", errProcessor, m.GetResponse())
			pw.CloseWithError(b.err)
			return
		}
		// A failed write means the upstream is done with the body: keep
		// draining the picker's messages so the response phase finds its
		// own.
		_, _ = pw.Write(sr.GetBody())
		if sr.GetEndOfStream() {
			pw.Close()
			return
		}
	}
}

// stop tells the pump the upstream reads no more.
func (b *bodyPump) stop() { b.reader.CloseWithError(errUpstreamDone) }

func (b *bodyPump) wait() error {
	<-b.done
	return b.err
}

// touchReader records whether anything read the body, which rules out a
// retry on another endpoint.
// Atomic because the transport reads on its own goroutine, which may still
// run when RoundTrip has returned an error.
type touchReader struct {
	r       io.Reader
	touched atomic.Bool
}

func (t *touchReader) Read(p []byte) (int, error) {
	t.touched.Store(true)
	return t.r.Read(p)
}

// countingReader counts the bytes the client sent; a body sender may still
// be reading when the access log is written.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
