package precise

import (
	"hash/maphash"
	"slices"
	"sync/atomic"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvindex"
)

// candidateSet is a decision's candidates as the match reads them: their
// addresses, resolved against the KV index and the speculative entries
// (a map lookup per candidate in each).
// Candidates rarely change between decisions (the datastore's healthy set
// is one shared slice until an endpoint comes, goes or changes health),
// so the scorer keeps the sets it resolved and reuses one while it holds
// the same endpoints in the same order and the index's ids are unchanged;
// the match then costs what the blocks' holders cost, not a lookup per
// candidate. A kept set is immutable.
type candidateSet struct {
	eps     []*endpoints.Endpoint
	names   []string
	index   kvindex.Candidates
	pending pendingCandidates // when speculative indexing is on
}

// keptSets is how many candidate sets a scorer keeps: the pool's, and a
// few subsets (x-gateway-destination-endpoint-subset) that recur.
const keptSets = 4

// candidateSets are a scorer's kept sets.
type candidateSets struct {
	kept [keptSets]atomic.Pointer[candidateSet]
	next atomic.Uint32 // the slot the next kept set replaces
	// missed fingerprints the last set not found: a set is kept when it
	// is missed twice in a row, so that subsets that do not recur are
	// resolved per decision, in the caller's scratch, without allocating.
	missed atomic.Uint64
	seed   maphash.Seed
}

func newCandidateSets() *candidateSets { return &candidateSets{seed: maphash.MakeSeed()} }

// get returns eps resolved against idx and pend (nil without speculative
// indexing): a kept set, or one resolved into scratch (valid until scratch
// is reused).
func (cs *candidateSets) get(idx *kvindex.Index, pend *pending, eps []*endpoints.Endpoint, scratch *candidateSet) *candidateSet {
	for i := range cs.kept {
		if v := cs.kept[i].Load(); v != nil && slices.Equal(v.eps, eps) && v.current(idx, pend) {
			return v
		}
	}
	if fp := cs.fingerprint(eps); cs.missed.Swap(fp) == fp {
		v := &candidateSet{eps: slices.Clone(eps)}
		v.resolve(idx, pend, eps, true)
		cs.kept[cs.next.Add(1)%keptSets].Store(v)
		return v
	}
	scratch.resolve(idx, pend, eps, false)
	return scratch
}

// current reports whether the set's ids are still the index's and
// pending's.
func (v *candidateSet) current(idx *kvindex.Index, pend *pending) bool {
	return v.index.Current(idx) && (pend == nil || pend.current(&v.pending))
}

// resolve fills the set for eps, reusing its memory; keep gives every
// candidate a speculative id, for a set kept across decisions.
func (v *candidateSet) resolve(idx *kvindex.Index, pend *pending, eps []*endpoints.Endpoint, keep bool) {
	v.names = v.names[:0]
	for _, e := range eps {
		v.names = append(v.names, e.Address())
	}
	idx.Resolve(&v.index, v.names)
	if pend != nil {
		pend.resolve(&v.pending, v.names, keep)
	}
}

// fingerprint tells sets apart well enough to decide what to keep (a kept
// set is compared in full before use): the length and a few endpoints.
func (cs *candidateSets) fingerprint(eps []*endpoints.Endpoint) uint64 {
	h := uint64(len(eps))
	for _, i := range [...]int{0, len(eps) / 3, len(eps) / 2, len(eps) - 1} {
		if i >= 0 && i < len(eps) {
			h = h*0x9e3779b97f4a7c15 ^ maphash.Comparable(cs.seed, eps[i])
		}
	}
	return h
}
