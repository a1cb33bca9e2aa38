package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// chunkSize bounds one body message to the picker; GIE re-sends bodies in
// chunks of at most ~62,000 bytes, so this keeps both directions alike.
const chunkSize = 62_000

// bodySender streams the client's request body to the picker
// (FULL_DUPLEX_STREAMED). It keeps no copy of what it sent: Envoy keeps
// none in this mode, so once the first chunk reached the sender a picker
// failure cannot fail open any more (see failOpen).
type bodySender struct {
	p    *processor
	src  io.Reader
	done chan struct{}
	// readErr is the client body's read error (not EOF), written before
	// done closes.
	readErr error
	// sendingSince is when the send in progress began (unix ns), 0
	// between sends: a send blocked for long means the picker stopped
	// reading, while time spent reading the client is the client's.
	sendingSince atomic.Int64

	mu sync.Mutex // guards the fields below
	// received is Envoy's body_received: the client's body (a chunk or
	// its end) reached the sender, which sends it on at once.
	received bool
	// withdrawn: a picker failure took the body back before any of it
	// was received (failOpen); the sender then stops, and unsent is what
	// its last read returned after that.
	withdrawn bool
	unsent    []byte
}

func startBodySender(ctx context.Context, p *processor, src io.Reader) *bodySender {
	s := &bodySender{p: p, src: src, done: make(chan struct{})}
	go s.run(ctx)
	return s
}

func (s *bodySender) run(ctx context.Context) {
	defer close(s.done)
	buf := make([]byte, chunkSize)
	for ctx.Err() == nil {
		n, err := s.src.Read(buf)
		eof := errors.Is(err, io.EOF)
		if (n > 0 || eof) && !s.receive(buf[:n]) {
			return
		}
		if n > 0 {
			// Send serializes before returning, so buf may be reused.
			if s.send(requestBody(buf[:n], false)) != nil {
				return
			}
		}
		if eof {
			_ = s.send(requestBody(nil, true))
			return
		}
		if err != nil {
			// The client went away (the request context ends with it) or
			// stalled past the idle timeout.
			s.readErr = err
			return
		}
	}
}

// receive records that b (possibly the body's empty end) reached the
// sender; false means the body was withdrawn first, and b stays unsent.
func (s *bodySender) receive(b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.withdrawn {
		s.unsent = b // the sender stops, so its buffer is not reused
		return false
	}
	s.received = true
	return true
}

// failOpen withdraws the body from the picker after a picker failure,
// when none of it was received yet: Envoy's Filter::failureModeAllow then
// still lets the request go on without the picker. It answers the same
// once it has withdrawn the body; false means the picker has some of the
// body and the failure fails the request.
func (s *bodySender) failOpen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.received {
		s.withdrawn = true
	}
	return s.withdrawn
}

// rest is the whole body again once failOpen has withdrawn it; it waits
// for the read in progress, whose bytes it starts with.
func (s *bodySender) rest() io.Reader {
	<-s.done
	return io.MultiReader(bytes.NewReader(s.unsent), s.src)
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

// startBodyPump starts the pump; sender is the client's body on its way to
// the picker, which answers with it as it arrives (see awaitPicker).
// failOpen rules on a picker failure: true sends the client's body on
// untouched, without the picker (only a body none of which reached it).
func startBodyPump(ctx context.Context, p *processor, sender *bodySender, failOpen func(error) bool) *bodyPump {
	pr, pw := io.Pipe()
	b := &bodyPump{reader: pr, done: make(chan struct{})}
	go b.run(ctx, p, sender, failOpen, pw)
	return b
}

func (b *bodyPump) run(ctx context.Context, p *processor, sender *bodySender, failOpen func(error) bool, pw *io.PipeWriter) {
	defer close(b.done)
	for {
		m, err := awaitPicker(ctx, p, sender)
		var sr *extprocv3.StreamedBodyResponse
		if err == nil {
			if sr = m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr == nil {
				err = fmt.Errorf("%w: want a streamed request body, got %T", errProcessor, m.GetResponse())
			}
		}
		if err != nil {
			if pickerFailed(err) && failOpen(err) {
				// The picker chose the upstream on the headers and failed
				// before any of the body reached it: the body goes there
				// as the client sends it.
				_, err = io.Copy(pw, sender.rest())
				pw.CloseWithError(err)
				return
			}
			b.err = err
			pw.CloseWithError(err)
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

// idleReader reads the client's body with a deadline on each read, so an
// upload that stalls for the idle timeout fails (os.ErrDeadlineExceeded)
// instead of holding its buffers for ever; interrupt makes a read in
// progress, and every later one, fail at once.
//
// Once the body has been read to its end, the connection's reads are no
// longer the body's: net/http reads in the background to notice the client
// leaving, and a deadline that fires there cancels the connection's own
// context, so every later request on that keep-alive connection would
// start with a cancelled context. So after the end no deadline is set,
// interrupt included; mu orders the end's reset against an interrupt.
type idleReader struct {
	r           io.Reader
	rc          *http.ResponseController
	idle        time.Duration
	interrupted atomic.Bool

	mu    sync.Mutex
	ended bool // the body was read to io.EOF
}

func newIdleReader(r io.Reader, rc *http.ResponseController, idle time.Duration) *idleReader {
	return &idleReader{r: r, rc: rc, idle: idle}
}

func (r *idleReader) Read(p []byte) (int, error) {
	if r.interrupted.Load() {
		return 0, os.ErrDeadlineExceeded
	}
	if r.idle > 0 {
		// Not every ResponseWriter supports deadlines (a test recorder);
		// then the body is read without one.
		_ = r.rc.SetReadDeadline(time.Now().Add(r.idle))
		if r.interrupted.Load() {
			// interrupt ran between the check above and the deadline just
			// set, which replaced its own: the read must still fail at
			// once. (An interrupt after this check sets its deadline
			// after ours.)
			_ = r.rc.SetReadDeadline(time.Now())
		}
	}
	n, err := r.r.Read(p)
	if errors.Is(err, io.EOF) {
		r.mu.Lock()
		r.ended = true
		// A deadline left behind would cut a long response, or cancel the
		// connection's later requests (see the type's comment). After a
		// timeout (no EOF) it stays, so that net/http's discarding of the
		// unread body fails at once too.
		_ = r.rc.SetReadDeadline(time.Time{})
		r.mu.Unlock()
	}
	return n, err
}

// interrupt stops a body that is still being read; a body read to its end
// has nothing left to stop.
func (r *idleReader) interrupt() {
	r.interrupted.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.ended {
		_ = r.rc.SetReadDeadline(time.Now())
	}
}

// idleWatch cancels an upstream exchange when neither direction moves for
// its timeout: no request body byte read, no response yet, no response
// body byte.
type idleWatch struct {
	d     time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func newIdleWatch(d time.Duration, cancel context.CancelFunc) *idleWatch {
	w := &idleWatch{d: d}
	if d > 0 {
		w.t = time.AfterFunc(d, func() { w.fired.Store(true); cancel() })
	}
	return w
}

func (w *idleWatch) touch() {
	if w.t != nil {
		w.t.Reset(w.d)
	}
}

func (w *idleWatch) stop() {
	if w.t != nil {
		w.t.Stop()
	}
}

func (w *idleWatch) reader(r io.Reader) io.Reader {
	if w.t == nil {
		return r
	}
	return &watchedReader{r: r, w: w}
}

func (w *idleWatch) readCloser(rc io.ReadCloser) io.ReadCloser {
	if w.t == nil {
		return rc
	}
	return struct {
		io.Reader
		io.Closer
	}{&watchedReader{r: rc, w: w}, rc}
}

type watchedReader struct {
	r io.Reader
	w *idleWatch
}

func (r *watchedReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.w.touch()
	}
	return n, err
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
