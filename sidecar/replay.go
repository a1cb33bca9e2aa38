package sidecar

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/bytebudget"
)

// staleRetry sends a request once more, on a connection dialled for it,
// when it failed on a reused keep-alive connection before any answer
// came back and the upstream cannot have run it: the failure came before
// the request was fully written (httptrace's WroteRequest not reached,
// or reporting the write's error), or the request carries an
// Idempotency-Key or X-Idempotency-Key header, its client's word that
// running it twice is harmless. A request written whole and then met by
// a closed connection is not replayed: the upstream that closed it may
// have read it and started the completion, and a replay could run it
// twice. net/http's Transport keeps the same rule for what it replays
// itself, beneath this wrapper (a body it can get again; a GET needs no
// key there); what it leaves failing is a request whose relayed client
// body it cannot get again, recorded here for that. net/http reports the
// request written before flushing its last buffered bytes, so a flush
// that fails after it counts as written: no replay, the safe side.
//
// A request body is replayed from GetBody when the request has one (the
// sidecar's buffered legs); a relayed client body is recorded as the
// first attempt reads it, up to max bytes and within keep, the budget all
// relayed requests share, until it is written whole (for a request
// without a key): past any of these it cannot be replayed and the
// failure stands. Only one replay is made, on a fresh connection
// (fresh), so a pool full of stale connections costs one retry, not one
// per connection.
type staleRetry struct {
	pooled http.RoundTripper
	fresh  http.RoundTripper // keep-alives off: always a new connection
	max    int64
	// keep bounds what all relayed bodies keep for a replay at once, so
	// that many concurrent large prompts cannot hold max bytes each; nil
	// keeps none (--replay-buffer-bytes 0). full counts the requests it
	// refused.
	keep *bytebudget.Budget
	full prometheus.Counter
	log  *slog.Logger
}

func (t *staleRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	first := req
	var rec *recordedBody
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		rec = &recordedBody{src: req.Body, max: t.max, held: t.keep.Hold(), over: t.keep == nil, full: t.full}
		first = shallowCopy(req)
		first.Body = rec
	}
	keyed := idempotencyKeyed(req.Header)
	// The hooks run on the transport's goroutines (the response reader's
	// among them), which a failed RoundTrip need not wait for: atomics.
	var reused, informed, answered, written atomic.Bool
	trace := &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			reused.Store(i.Reused)
			if !i.Reused {
				rec.noReplay() // a new connection's failure is not retried
			}
		},
		// A 1xx answer may already have been relayed to the client.
		Got1xxResponse: func(int, textproto.MIMEHeader) error { informed.Store(true); return nil },
		// The upstream may have the whole request: without a key, a replay
		// could run it twice.
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil && !keyed {
				written.Store(true)
				rec.noReplay()
			}
		},
		// The upstream has seen the request: replaying it could run it twice.
		GotFirstResponseByte: func() { answered.Store(true); rec.noReplay() },
	}
	first = first.WithContext(httptrace.WithClientTrace(first.Context(), trace))
	resp, err := t.pooled.RoundTrip(first)
	if err == nil || !reused.Load() || informed.Load() || answered.Load() || req.Context().Err() != nil {
		rec.release()
		return resp, err
	}
	if written.Load() {
		rec.release()
		t.log.Info("request failed on a reused connection after it was written whole; not replayed, the upstream may have run it (an Idempotency-Key header allows a replay)",
			"err", err, "path", req.URL.Path)
		return resp, err
	}
	again := shallowCopy(req)
	switch {
	case req.GetBody != nil:
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, fmt.Errorf("%w (not replayed: its body: %w)", err, gerr)
		}
		again.Body = body
	case rec != nil:
		body, ok := rec.replay()
		if !ok {
			t.log.Info("request failed on a reused connection; its body cannot be replayed (more than the limit read, the replay buffer spent, or still being read)",
				"err", err, "path", req.URL.Path, "limit", t.max, "replay_buffer_bytes", t.keep.Limit())
			return nil, err
		}
		// The kept bytes stay reserved while the fresh transport sends
		// them: a burst of stale connections replays many bodies at once.
		defer rec.drop()
		again.Body = body
	}
	t.log.Info("request failed on a reused connection before any answer, unwritten or idempotency-keyed; sending it again on a new one",
		"err", err, "path", req.URL.Path, "keyed", keyed)
	return t.fresh.RoundTrip(again)
}

// idempotencyKeyed reports whether h carries one of the headers with
// which net/http lets a client mark a request safe to send twice (their
// presence, whatever the value).
func idempotencyKeyed(h http.Header) bool {
	for _, k := range idempotencyHeaders {
		if _, ok := h[k]; ok {
			return true
		}
	}
	return false
}

// CloseIdleConnections closes the pooled transport's idle connections
// (the fresh one keeps none), which http.Client.CloseIdleConnections
// reaches only through this method.
func (t *staleRetry) CloseIdleConnections() {
	if c, ok := t.pooled.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// shallowCopy is r with its own struct, so that its body can change
// without touching the caller's request (a RoundTripper must not).
func shallowCopy(r *http.Request) *http.Request {
	c := *r
	return &c
}

// recordedBody is a relayed client body that keeps what the first
// attempt read, up to max bytes and as held allows, so that the attempt
// can be replayed; held is given back as soon as nothing is kept.
// Closing it does not close the client's body until release or replay
// decides whether it is still needed. The transport reads it from its
// write goroutine and may close it from another; the lock is never held
// across the client's Read, which can block for as long as the client
// takes to send.
type recordedBody struct {
	src  io.ReadCloser
	max  int64
	full prometheus.Counter // the budget refused what was read

	mu       sync.Mutex
	kept     []byte
	held     bytebudget.Holder // cap(kept), reserved before it is allocated
	over     bool              // more than max read, the budget spent, or no replay possible: nothing kept
	reading  bool              // a Read of src is under way
	closed   bool              // the transport closed it
	released bool              // no replay: Close goes through
	frozen   bool              // a replay took over src
}

var errReplaced = errors.New("request body taken over by a retry")

func (b *recordedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.frozen {
		b.mu.Unlock()
		return 0, errReplaced
	}
	b.reading = true
	b.mu.Unlock()
	n, err := b.src.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reading = false
	if !b.over && n > 0 {
		b.keep(p[:n])
	}
	return n, err
}

// keep appends p to what is kept, reserving a larger buffer's bytes
// before allocating it; b.mu is held.
func (b *recordedBody) keep(p []byte) {
	need := int64(len(b.kept) + len(p))
	if need > b.max {
		b.stopKeeping()
		return
	}
	var err error
	if b.kept, err = b.held.Append(b.kept, p, int(b.max)); err != nil {
		b.full.Inc()
		b.stopKeeping()
	}
}

// stopKeeping drops the kept bytes for good and gives their reservation
// back; b.mu is held.
func (b *recordedBody) stopKeeping() {
	b.over, b.kept = true, nil
	b.held.Done()
}

// drop gives back the reservation of the bytes a replay took over, once
// its answer came (or it failed).
func (b *recordedBody) drop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held.Done()
}

// noReplay is called once a failure could no longer be replayed (a new
// connection, or an answer under way): what is read next is not kept.
// Nil-safe.
func (b *recordedBody) noReplay() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.frozen { // a replay's bytes are given back by drop
		b.stopKeeping()
	}
}

func (b *recordedBody) Close() error {
	b.mu.Lock()
	b.closed = true
	through := b.released
	b.mu.Unlock()
	if through {
		return b.src.Close()
	}
	return nil
}

// release gives up the replay: the kept bytes are dropped, and a Close
// the transport made or will make reaches the client's body. Nil-safe.
func (b *recordedBody) release() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.released = true
	b.stopKeeping()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		_ = b.src.Close()
	}
}

// replay is the body for the second attempt: what the first read, then
// the rest of the client's body; false when that cannot be had (too much
// read to keep, or the first attempt still reading).
func (b *recordedBody) replay() (io.ReadCloser, bool) {
	b.mu.Lock()
	if b.over || b.reading {
		b.mu.Unlock()
		b.release()
		return nil, false
	}
	b.frozen = true
	kept := b.kept
	b.kept = nil
	b.mu.Unlock()
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(kept), b.src), b.src}, true
}
