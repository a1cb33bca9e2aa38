package scheduling

import (
	"sync"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// CycleState carries data between the plugins of one scheduling cycle (one
// request), for example prefix hashes a scorer computed and its PreRequest
// hook reuses. It is owned by the request: no locking, no sharing across
// requests. Values are reached only through a Key; see Write and Read.
type CycleState struct {
	// A cycle holds a value or two per stateful plugin: inline slots keep
	// them without a map allocation per request, and the few keys make a
	// linear scan of pointers cheaper than hashing.
	slots    [inlineSlots]slot
	n        int
	overflow []slot

	// The decision's own storage (NewResult, NewProfileResult, OneProfile
	// and the scheduler's per-profile results), reused with the state so
	// that a released state's next cycle allocates nothing for them.
	results     map[string]*ProfileResult
	resultsUsed bool
	result      Result
	resultUsed  bool
	profiles    [inlineProfiles]ProfileResult
	nProfiles   int
	targets     []*endpoints.Endpoint
	next        [1]*Profile
}

// inlineProfiles is how many profile results a cycle keeps inline: one
// for a single-profile configuration, two for P/D.
const inlineProfiles = 2

// Recycler is a value stored in a CycleState that can be reused once its
// request has ended: Release calls Recycle on each such value, and the
// plugin that made it may hand it to a later request. A plugin's
// per-request state implements it to go back to that plugin's pool.
type Recycler interface {
	Recycle()
}

// DecisionScoped is a value stored in a CycleState that keeps a part
// only the decision reads (a snapshot per candidate) and that another
// plugin's PreRequest may still read: since the PreRequest hooks run in
// the configuration's order, its own plugin's PreRequest cannot drop that
// part, and Decided calls Decided on each such value once every PreRequest
// and Hold hook of the decision has run. The value then drops the part,
// or hands it back to its pool, rather than let a streaming response keep
// it until the response ends. A value stored under two keys is told
// twice, so Decided must do nothing the second time.
type DecisionScoped interface {
	Decided()
}

var cycleStates = sync.Pool{New: func() any { return new(CycleState) }}

// AcquireCycleState returns an empty state, reusing one that was released.
// The owner of the request (the director) acquires it before scheduling
// and releases it after the last response hook.
func AcquireCycleState() *CycleState { return cycleStates.Get().(*CycleState) }

// Release ends the state's request: every stored value that is a Recycler
// is recycled, and the state, with the Result and ProfileResults made from
// it, is reused by a later request. Neither the state nor anything read
// from it (plugin state, the Result, its targets) may be used afterwards.
// A state that is never released is simply collected.
func (cs *CycleState) Release() {
	cs.each(func(v any) {
		if r, ok := v.(Recycler); ok {
			r.Recycle()
		}
	})
	clear(cs.slots[:cs.n])
	cs.n = 0
	clear(cs.overflow)
	cs.overflow = cs.overflow[:0]
	clear(cs.results)
	cs.resultsUsed = false
	cs.result, cs.resultUsed = Result{}, false
	clear(cs.profiles[:cs.nProfiles])
	cs.nProfiles = 0
	clear(cs.targets[:cap(cs.targets)])
	cs.targets = cs.targets[:0]
	cs.next[0] = nil
	cycleStates.Put(cs)
}

// Decided tells the stored values that the decision is made: the owner of
// the request (the director) calls it after the decision's last PreRequest
// and Hold hook, and every stored DecisionScoped value drops what only the
// decision reads. The values stay readable; the response hooks read what
// is left of them.
func (cs *CycleState) Decided() {
	cs.each(func(v any) {
		if d, ok := v.(DecisionScoped); ok {
			d.Decided()
		}
	})
}

// each calls f on every stored value, in the order they were stored.
func (cs *CycleState) each(f func(any)) {
	for i := range cs.n {
		f(cs.slots[i].v)
	}
	for i := range cs.overflow {
		f(cs.overflow[i].v)
	}
}

// profileResults is the scheduler's per-profile result map for this
// cycle: the state's own map the first time, a new one if a cycle is
// scheduled twice (the first Result keeps its map).
func (cs *CycleState) profileResults(n int) map[string]*ProfileResult {
	if cs.resultsUsed {
		return make(map[string]*ProfileResult, n)
	}
	cs.resultsUsed = true
	if cs.results == nil {
		cs.results = make(map[string]*ProfileResult, max(n, inlineProfiles))
	}
	return cs.results
}

// NewResult returns an empty Result for a profile handler's
// ProcessResults, valid until cs is released (a new one when cs is nil).
func NewResult(cs *CycleState) *Result {
	if cs == nil || cs.resultUsed {
		return &Result{}
	}
	cs.resultUsed = true
	return &cs.result
}

// NewProfileResult returns a picker's result with n zero Targets, valid
// until cs is released (a new one when cs is nil).
func NewProfileResult(cs *CycleState, n int) *ProfileResult {
	if cs == nil {
		return &ProfileResult{Targets: make([]*endpoints.Endpoint, n)}
	}
	var r *ProfileResult
	if cs.nProfiles < len(cs.profiles) {
		r = &cs.profiles[cs.nProfiles]
		cs.nProfiles++
	} else {
		r = &ProfileResult{}
	}
	if len(cs.targets)+n > cap(cs.targets) {
		// Earlier results keep the old array.
		cs.targets = make([]*endpoints.Endpoint, 0, max(2*cap(cs.targets), n, 4))
	}
	off := len(cs.targets)
	cs.targets = cs.targets[:off+n]
	r.Targets = cs.targets[off : off+n : off+n]
	return r
}

// OneProfile is a profile handler's answer naming p alone, valid until
// the handler's next call on cs (a new slice when cs is nil).
func OneProfile(cs *CycleState, p *Profile) []*Profile {
	if cs == nil {
		return []*Profile{p}
	}
	cs.next[0] = p
	return cs.next[:]
}

const inlineSlots = 4

type slot struct {
	id *keyID
	v  any
}

// Key names one value in a CycleState and fixes its type. Every NewKey call
// makes a distinct key, even for an equal name, so two plugins (or two
// instances of one plugin) cannot overwrite each other's values by
// choosing the same name, and only code that holds a key can reach its
// value. A plugin that shares state with another exports its key.
type Key[T any] struct{ id *keyID }

type keyID struct{ name string }

// NewKey returns a new key; name appears only in messages. Make keys once,
// at package initialisation or in the plugin factory, not per request.
func NewKey[T any](name string) Key[T] { return Key[T]{&keyID{name}} }

// String returns the key's name.
func (k Key[T]) String() string {
	if k.id == nil {
		return "<zero Key>"
	}
	return k.id.name
}

// NewCycleState returns an empty state. The zero CycleState is empty too.
func NewCycleState() *CycleState { return &CycleState{} }

// Write stores v under k, replacing an earlier value. Storing a pointer keeps
// the hot path free of allocations (a non-pointer value is boxed) and lets
// later stages update the value in place. The zero Key is a programming
// error: Write panics rather than let unrelated zero keys share a value.
func Write[T any](cs *CycleState, k Key[T], v T) {
	if k.id == nil {
		panic("scheduling.Write: zero Key; make keys with NewKey")
	}
	if s := cs.find(k.id); s != nil {
		s.v = v
		return
	}
	if cs.n < len(cs.slots) {
		cs.slots[cs.n] = slot{k.id, v}
		cs.n++
		return
	}
	cs.overflow = append(cs.overflow, slot{k.id, v})
}

// Read returns the value stored under k; false if none was (or a nil
// interface was stored).
func Read[T any](cs *CycleState, k Key[T]) (T, bool) {
	if s := cs.find(k.id); s != nil {
		// Only Write[T] stores under k's id, so this holds unless a key was
		// converted between value types.
		v, ok := s.v.(T)
		return v, ok
	}
	var zero T
	return zero, false
}

// find returns the slot holding id; nil if none does (always for the zero
// Key, which Write never stores).
func (cs *CycleState) find(id *keyID) *slot {
	for i := range cs.n {
		if cs.slots[i].id == id {
			return &cs.slots[i]
		}
	}
	for i := range cs.overflow {
		if cs.overflow[i].id == id {
			return &cs.overflow[i]
		}
	}
	return nil
}
