package testutil

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// ErrNoSSEData: the stream ended before its first data line.
var ErrNoSSEData = errors.New("stream ended before its first SSE data line")

// StreamOrder reads an SSE body in two phases: it returns once the first
// data line has arrived, calling first (for instance to record when the
// first token came), then drains the rest. Tests that compare the order
// in which an engine served requests use the first token rather than the
// end of the response: a client may finish reading a long answer after a
// short one that the engine started later.
func StreamOrder(body io.Reader, first func(data []byte)) error {
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadBytes('\n')
		if payload, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:")); ok {
			first(bytes.TrimSpace(payload))
			if _, err := io.Copy(io.Discard, br); err != nil {
				return fmt.Errorf("draining the stream: %w", err)
			}
			return nil
		}
		if err == io.EOF {
			return ErrNoSSEData
		}
		if err != nil {
			return fmt.Errorf("reading the stream: %w", err)
		}
	}
}
