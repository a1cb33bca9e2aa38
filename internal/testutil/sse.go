package testutil

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// ErrNoSSEData: the stream ended before its first data line.
var ErrNoSSEData = errors.New("stream ended before its first SSE data line")

// SSEEvent is one event of a text/event-stream body: the lines up to a
// blank line.
type SSEEvent struct {
	// Data holds each data line's value in order, the one space after
	// "data:" removed as SSE prescribes.
	Data []string
	// Other holds the event's other lines as sent (comments, event:,
	// id:), so that a test of a server's framing can refuse them.
	Other []string
}

// Payload is what an EventSource client delivers for the event: its data
// lines joined by newlines.
func (e SSEEvent) Payload() string { return strings.Join(e.Data, "\n") }

// SSEReader reads the events of a stream one at a time, so that a test can
// act between two events of a live response. Lines end in LF or CRLF;
// a last event that the stream's end cuts before its blank line still
// counts. Lines have no length limit.
type SSEReader struct{ br *bufio.Reader }

// NewSSEReader reads events from body.
func NewSSEReader(body io.Reader) *SSEReader { return &SSEReader{br: bufio.NewReader(body)} }

// Next returns the next event; io.EOF once the stream ended with no event
// pending.
func (r *SSEReader) Next() (SSEEvent, error) {
	var ev SSEEvent
	pending := false
	for {
		line, err := r.br.ReadString('\n')
		if err != nil && err != io.EOF {
			return SSEEvent{}, fmt.Errorf("reading the stream: %w", err)
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			if pending {
				return ev, nil
			}
		} else {
			pending = true
			if v, ok := strings.CutPrefix(line, "data:"); ok {
				ev.Data = append(ev.Data, strings.TrimPrefix(v, " "))
			} else {
				ev.Other = append(ev.Other, line)
			}
		}
		if err == io.EOF {
			if pending {
				return ev, nil
			}
			return SSEEvent{}, io.EOF
		}
	}
}

// NextData returns the payload of the next event that has data lines,
// passing over comments and events without data; io.EOF once the stream
// ended.
func (r *SSEReader) NextData() (string, error) {
	for {
		ev, err := r.Next()
		if err != nil {
			return "", err
		}
		if len(ev.Data) > 0 {
			return ev.Payload(), nil
		}
	}
}

// SSEData returns the payloads of a whole SSE body, "[DONE]" included,
// in order.
func SSEData(body []byte) []string {
	r := NewSSEReader(bytes.NewReader(body))
	var out []string
	for {
		p, err := r.NextData()
		if err != nil { // only io.EOF: a bytes.Reader does not fail
			return out
		}
		out = append(out, p)
	}
}

// StreamOrder reads an SSE body in two phases: it returns once the first
// event with data has arrived, calling first with its payload (for
// instance to record when the first token came), then drains the rest.
// Tests that compare the order in which an engine served requests use the
// first token rather than the end of the response: a client may finish
// reading a long answer after a short one that the engine started later.
func StreamOrder(body io.Reader, first func(data []byte)) error {
	r := NewSSEReader(body)
	p, err := r.NextData()
	if err == io.EOF {
		return ErrNoSSEData
	}
	if err != nil {
		return err
	}
	first([]byte(p))
	if _, err := io.Copy(io.Discard, r.br); err != nil {
		return fmt.Errorf("draining the stream: %w", err)
	}
	return nil
}

// FirstTokens records, across concurrent streams, the order in which
// their first tokens arrived and when: the order an engine with one
// sequence slot served them in. The zero value is ready.
type FirstTokens struct {
	mu    sync.Mutex
	order []string
	at    map[string]time.Time
}

// Read reads the stream of the request called name (StreamOrder), noting
// its first token.
func (f *FirstTokens) Read(name string, body io.Reader) error {
	return StreamOrder(body, func([]byte) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.at == nil {
			f.at = map[string]time.Time{}
		}
		f.order = append(f.order, name)
		f.at[name] = time.Now()
	})
}

// Order is the names in first-token order.
func (f *FirstTokens) Order() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.order...)
}

// At is when name's first token came (ok false: it has not).
func (f *FirstTokens) At(name string) (at time.Time, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok = f.at[name]
	return at, ok
}

// Before counts the requests whose names start with prefix that got their
// first token before name did; -1 if name got none.
func (f *FirstTokens) Before(name, prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, o := range f.order {
		if o == name {
			return n
		}
		if strings.HasPrefix(o, prefix) {
			n++
		}
	}
	return -1
}

// EarlyHeaderThrough is the regression test of a proxy against a model
// server that sends its header as soon as it has read the request body
// (vLLM and `kvgate sim` with "stream": true), while the proxy's
// transport may not yet have made its last read of that body, the one
// that finds its end. An HTTP/1 server closes a request body left unread
// when the handler writes its header; the transport's read then failed,
// it closed the upstream connection, and the client got a 200 with a cut
// stream. proxy starts the proxy in front of such a server at upstream
// (host:port) and returns its base URL; 1200 streamed completions, 8 at a
// time, must each arrive whole: a 200 ending with data: [DONE]. The race
// shows now and then (a few in a thousand), not every time.
func EarlyHeaderThrough(t *testing.T, proxy func(upstream string) (baseURL string)) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(streamAfterBody))
	t.Cleanup(up.Close)
	url := proxy(strings.TrimPrefix(up.URL, "http://")) + "/v1/completions"
	body := []byte(`{"model":"m","stream":true,"max_tokens":3,"prompt":"` + strings.Repeat("lorem ipsum ", 250) + `"}`)
	const workers, each = 8, 150
	ctx, cancel := context.WithTimeout(t.Context(), 3*WaitTimeout) // hang guard
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for range workers {
		wg.Go(func() {
			for range each {
				errs <- postStream(ctx, url, body)
			}
		})
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if err == nil {
			continue
		}
		if n < 3 {
			t.Error(err)
		}
		n++
	}
	if n > 0 {
		t.Errorf("%d of %d requests failed", n, workers*each)
	}
}

func postStream(ctx context.Context, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return fmt.Errorf("status %d, body read after %d bytes: %w", resp.StatusCode, len(raw), err)
	case resp.StatusCode != http.StatusOK || !bytes.HasSuffix(raw, []byte("data: [DONE]\n\n")):
		return fmt.Errorf("status %d, body %q", resp.StatusCode, raw)
	}
	return nil
}

// streamAfterBody reads the whole body, sends the header at once, then
// three events a millisecond apart and data: [DONE].
func streamAfterBody(w http.ResponseWriter, r *http.Request) {
	if _, err := io.ReadAll(r.Body); err != nil {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for i := range 3 {
		time.Sleep(time.Millisecond)
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d\",\"finish_reason\":null}]}\n\n", i)
		_ = rc.Flush()
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}
