package workload

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// MooncakeBlockTokens is the number of tokens one Mooncake hash id stands
// for.
const MooncakeBlockTokens = 512

// Limits on what a trace may ask for, so that a corrupt or hostile file
// cannot make the loader allocate without bound.
const (
	MaxTraceRequests = 1 << 20
	maxLineBytes     = 1 << 20
	maxInputTokens   = 1 << 21
	maxOutputTokens  = 1 << 20
)

// ErrTrace reports a malformed trace; the error names the line.
var ErrTrace = errors.New("invalid trace")

type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// LoadMooncake reads a Mooncake trace: one JSON object per line with
// timestamp (ms), input_length, output_length and hash_ids, each hash id a
// block of 512 tokens, the last block cut to input_length. Blank lines are
// skipped. Requests are returned in arrival order.
func LoadMooncake(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var out []Request
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		if len(out) == MaxTraceRequests {
			return nil, fmt.Errorf("%w: more than %d requests", ErrTrace, MaxTraceRequests)
		}
		req, err := parseMooncake(b)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTrace, err)
	}
	sortByArrival(out)
	return out, nil
}

func parseMooncake(b []byte) (Request, error) {
	var l mooncakeLine
	if err := json.Unmarshal(b, &l); err != nil {
		return Request{}, err
	}
	switch {
	case l.Timestamp == nil || l.InputLength == nil || l.OutputLength == nil:
		return Request{}, errors.New("timestamp, input_length and output_length are required")
	case *l.Timestamp < 0 || *l.Timestamp > float64(365*24*time.Hour/time.Millisecond):
		return Request{}, fmt.Errorf("timestamp %v out of range", *l.Timestamp)
	case *l.InputLength < 1 || *l.InputLength > maxInputTokens:
		return Request{}, fmt.Errorf("input_length %d out of range", *l.InputLength)
	case *l.OutputLength < 1 || *l.OutputLength > maxOutputTokens:
		return Request{}, fmt.Errorf("output_length %d out of range", *l.OutputLength)
	}
	in := *l.InputLength
	// Mooncake's hash ids cover ceil(input/512) blocks; a trace with fewer
	// ids leaves the rest of the prompt unshared, one with more is cut.
	segs := make([]Segment, 0, (in+MooncakeBlockTokens-1)/MooncakeBlockTokens)
	left := in
	for _, id := range l.HashIDs {
		if left == 0 {
			break
		}
		n := min(left, MooncakeBlockTokens)
		segs = append(segs, Segment{Key: key(nsMooncake, id, 0), Len: n})
		left -= n
	}
	if left > 0 {
		// Unshared remainder: keyed by the line's content so that the
		// same line always yields the same tokens.
		segs = append(segs, Segment{Key: key(nsUnique, uint64(in), fnv(b)), Len: left})
	}
	return Request{
		Arrival:      time.Duration(*l.Timestamp * float64(time.Millisecond)),
		Segments:     segs,
		OutputTokens: *l.OutputLength,
	}, nil
}

func fnv(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
