package workload

import (
	"cmp"
	"fmt"
	"io"
	"slices"

	"github.com/kvgate/kvgate/internal/mooncake"
)

// BlockTokens is the Mooncake trace's block size.
const BlockTokens = mooncake.BlockTokens

// Entry is one line of the trace.
type Entry = mooncake.Record

// ErrBadEntry is wrapped by errors about a malformed trace line.
var ErrBadEntry = mooncake.ErrTrace

// ReadTrace reads at most limit entries (limit ≤ 0: all) with the reader
// `kvgate bench` uses. An entry must also name at least one block: the
// demo builds prompt text from the blocks and groups entries by the first.
func ReadTrace(r io.Reader, limit int) ([]Entry, error) {
	out, err := mooncake.Read(r, limit)
	if err != nil {
		return nil, err
	}
	for i, e := range out {
		if len(e.HashIDs) == 0 {
			return nil, fmt.Errorf("%w: entry %d: no hash ids", ErrBadEntry, i+1)
		}
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
	byHead := make(map[uint64]*group)
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
