package workload

import (
	"io"

	"github.com/kvgate/kvgate/internal/mooncake"
)

// MooncakeBlockTokens is the number of tokens one Mooncake hash id stands
// for.
const MooncakeBlockTokens = mooncake.BlockTokens

// MaxTraceRequests bounds the requests of one trace.
const MaxTraceRequests = mooncake.MaxRecords

const maxInputTokens = mooncake.MaxInputTokens

// ErrTrace reports a malformed trace; the error names the line.
var ErrTrace = mooncake.ErrTrace

// LoadMooncake reads a Mooncake trace (see mooncake.Read), each hash id a
// block of 512 tokens, the last block cut to input_length. Requests are
// returned in arrival order.
func LoadMooncake(r io.Reader) ([]Request, error) {
	recs, err := mooncake.Read(r, 0)
	if err != nil {
		return nil, err
	}
	out := make([]Request, len(recs))
	for i, rec := range recs {
		out[i] = fromMooncake(rec)
	}
	sortByArrival(out)
	return out, nil
}

func fromMooncake(rec mooncake.Record) Request {
	in := rec.InputLength
	// Mooncake's hash ids cover ceil(input/512) blocks; a trace with fewer
	// ids leaves the rest of the prompt unshared, one with more is cut.
	segs := make([]Segment, 0, (in+MooncakeBlockTokens-1)/MooncakeBlockTokens)
	left := in
	for _, id := range rec.HashIDs {
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
		segs = append(segs, Segment{Key: key(nsUnique, uint64(in), rec.Digest), Len: left})
	}
	return Request{Arrival: rec.Arrival(), Segments: segs, OutputTokens: rec.OutputLength}
}
