package workload

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// BlockTokens is the Mooncake trace's block size.
const BlockTokens = 512

// maxLineBytes bounds one trace line (a 1M-token request is ~16 KB).
const maxLineBytes = 1 << 20

// maxHashIDs bounds the blocks of one entry (a 4M-token context).
const maxHashIDs = 8192

// Entry is one line of the trace.
type Entry struct {
	// Timestamp is the arrival time in milliseconds from the trace start.
	Timestamp    int64   `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// ErrBadEntry is wrapped by errors about a malformed trace line.
var ErrBadEntry = errors.New("bad trace entry")

// ReadTrace reads at most limit entries (limit ≤ 0: all).
func ReadTrace(r io.Reader, limit int) ([]Entry, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var out []Entry
	for line := 1; sc.Scan() && (limit <= 0 || len(out) < limit); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("line %d: %w: %w", line, ErrBadEntry, err)
		}
		switch {
		case e.Timestamp < 0, e.InputLength < 0, e.OutputLength < 0:
			return nil, fmt.Errorf("line %d: %w: negative field", line, ErrBadEntry)
		case len(e.HashIDs) == 0 || len(e.HashIDs) > maxHashIDs:
			return nil, fmt.Errorf("line %d: %w: %d hash ids", line, ErrBadEntry, len(e.HashIDs))
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	return out, nil
}

// Select returns n entries (fewer if the trace is shorter): whole prefix
// groups, largest first, then the chosen entries in trace order. Groups of
// equal size keep trace order, so the choice is deterministic.
func Select(entries []Entry, n int) []Entry {
	if n >= len(entries) {
		return slices.Clone(entries)
	}
	type group struct {
		first   int // index of its first entry
		members []int
	}
	byHead := make(map[int64]*group)
	var groups []*group
	for i, e := range entries {
		g := byHead[e.HashIDs[0]]
		if g == nil {
			g = &group{first: i}
			byHead[e.HashIDs[0]] = g
			groups = append(groups, g)
		}
		g.members = append(g.members, i)
	}
	slices.SortStableFunc(groups, func(a, b *group) int { return cmp.Compare(len(b.members), len(a.members)) })
	picked := make([]int, 0, n)
	for _, g := range groups {
		if len(picked) >= n {
			break
		}
		picked = append(picked, g.members[:min(len(g.members), n-len(picked))]...)
	}
	slices.Sort(picked)
	out := make([]Entry, len(picked))
	for i, idx := range picked {
		out[i] = entries[idx]
	}
	return out
}
