package transfercost

import "github.com/kvgate/kvgate/extproc/scheduling"

// TTFTsOf is the request's snapshot of each candidate's predicted TTFT, for
// the tests' weak pointers; nil when none is kept.
func TTFTsOf(d *Decider, cs *scheduling.CycleState) []float64 {
	if st, ok := scheduling.Read(cs, d.key); ok {
		return st.ttft
	}
	return nil
}
