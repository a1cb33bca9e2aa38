package scheduling

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
