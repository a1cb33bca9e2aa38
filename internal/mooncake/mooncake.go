// Package mooncake reads Mooncake traces, for `kvgate bench` (which
// simulates them at full size) and `kvgate up` (which replays them scaled
// down): one reader, so that a trace loads in both or in neither.
package mooncake

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// BlockTokens is the number of tokens one hash id stands for.
const BlockTokens = 512

// Limits on what a trace may ask for, so that a corrupt or hostile file
// cannot make a reader allocate without bound.
const (
	MaxRecords      = 1 << 20
	MaxInputTokens  = 1 << 21
	MaxOutputTokens = 1 << 20
	// MaxHashIDs bounds one record's blocks (a 4M-token context).
	MaxHashIDs   = 8192
	maxLineBytes = 1 << 20
)

// maxTimestampMs bounds arrival times to a year of trace.
const maxTimestampMs = float64(365 * 24 * time.Hour / time.Millisecond)

// ErrTrace is wrapped by errors about a malformed trace; they name the
// line.
var ErrTrace = errors.New("invalid trace")

// Record is one line of a trace.
type Record struct {
	// Timestamp is the arrival time in milliseconds from the trace start;
	// traces may give fractions of a millisecond.
	Timestamp    float64
	InputLength  int
	OutputLength int
	// HashIDs name the prompt's 512-token blocks; equal ids are shared
	// prefixes. A trace may give fewer than the prompt's blocks, or none.
	HashIDs []uint64
	// Digest identifies the line's content, so that a consumer can derive
	// a record's unshared tokens deterministically from it.
	Digest uint64
}

// Arrival is the record's timestamp as a duration.
func (r Record) Arrival() time.Duration {
	return time.Duration(r.Timestamp * float64(time.Millisecond))
}

type line struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// Read reads a trace: one JSON object per line with timestamp (ms),
// input_length, output_length and optionally hash_ids. Blank lines are
// skipped. Records keep the file's order. With limit > 0 it stops after
// limit records; otherwise a trace of more than MaxRecords is an error.
func Read(r io.Reader, limit int) ([]Record, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var out []Record
	for n := 1; (limit <= 0 || len(out) < limit) && sc.Scan(); n++ {
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		if len(out) == MaxRecords {
			return nil, fmt.Errorf("%w: more than %d requests", ErrTrace, MaxRecords)
		}
		rec, err := parse(b)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, n, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTrace, err)
	}
	return out, nil
}

func parse(b []byte) (Record, error) {
	var l line
	if err := json.Unmarshal(b, &l); err != nil {
		return Record{}, err
	}
	switch {
	case l.Timestamp == nil || l.InputLength == nil || l.OutputLength == nil:
		return Record{}, errors.New("timestamp, input_length and output_length are required")
	case !(*l.Timestamp >= 0 && *l.Timestamp <= maxTimestampMs):
		return Record{}, fmt.Errorf("timestamp %v out of range", *l.Timestamp)
	case *l.InputLength < 1 || *l.InputLength > MaxInputTokens:
		return Record{}, fmt.Errorf("input_length %d out of range", *l.InputLength)
	case *l.OutputLength < 1 || *l.OutputLength > MaxOutputTokens:
		return Record{}, fmt.Errorf("output_length %d out of range", *l.OutputLength)
	case len(l.HashIDs) > MaxHashIDs:
		return Record{}, fmt.Errorf("%d hash ids: at most %d", len(l.HashIDs), MaxHashIDs)
	}
	return Record{Timestamp: *l.Timestamp, InputLength: *l.InputLength, OutputLength: *l.OutputLength, HashIDs: l.HashIDs, Digest: fnv(b)}, nil
}

// fnv is FNV-1a over the line.
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
