package testutil

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
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
