// Package scheduling is the picker's Filter → Score → Pick framework.
//
// A Scheduler runs scheduling profiles chosen by a ProfileHandler. Each
// Profile narrows the candidate endpoints with its Filters, adds up its
// Scorers' weighted scores (Σ weight × score, not normalised, each score in
// [0, 1]) and lets its Picker choose the targets. Plugins are built by type
// name from configuration through a Registry; request-lifecycle hooks
// (PreRequest, response observers) let plugins track what they routed.
//
// # Cycle state
//
// Plugins pass per-request data between their stages (Score to PreRequest
// to ResponseComplete) in the request's CycleState, through typed keys: a
// plugin makes a Key once and reads and writes only through it, so there
// are no string keys to collide and no type assertions at call sites.
//
//	type Scorer struct {
//		scheduling.Named
//		key scheduling.Key[*myState] // made in the factory: one per instance
//	}
//
//	func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
//		s := &Scorer{Named: scheduling.NewNamed(Type, name)}
//		s.key = scheduling.NewKey[*myState](s.TypedName().String())
//		return s, nil
//	}
//
//	// in Score:      scheduling.Write(cs, s.key, &myState{...})
//	// in PreRequest: if st, ok := scheduling.Read(cs, s.key); ok { ... }
//
// Keys compare by identity, not by name: a key made per plugin instance
// keeps two configured instances apart, and a key made at package level is
// shared by all instances. A plugin that lets another read its state
// exports the key (precise.Scorer.StateKey). Store pointers: they are not
// boxed, so the hot path stays allocation-free. This replaces the earlier
// string-keyed cs.Write(key, v) and ReadAs[T](cs, key); code written
// against those moves a string constant to a Key made with NewKey.
//
// The framework allocates nothing per decision: per-request scratch
// buffers come from a sync.Pool, scores are dense slices aligned with the
// candidate list rather than maps, and the cycle state keeps its few values
// inline.
//
// # Recycling a request's state
//
// The director takes each request's CycleState from a pool
// (AcquireCycleState) and releases it after the request's last response
// hook (CycleState.Release). The decision's own storage lives in the state:
// pickers build their result with NewProfileResult, profile handlers with
// NewResult and OneProfile, and the scheduler's per-profile map is the
// state's, all reused by the next request. A plugin's per-request value
// that implements Recycler is handed back at Release, so the plugin can
// keep it in its own pool with its buffers:
//
//	func (st *myState) Recycle() { *st = myState{owner: st.owner, buf: st.buf[:0]}; st.owner.states.Put(st) }
//
// After Release nothing read from the state (plugin values, the Result, its
// targets) may be used; a state never released is simply collected, so
// code that makes one with NewCycleState needs no release. The pin is
// extproc/config's TestPickAllocations: zero allocations per decision for
// the default and the precise profiles.
//
// The state lives until the response ends, a streaming response's whole
// decode: a value that only the decision reads (a prompt's tokens or block
// hashes, a snapshot per candidate) is dropped, or handed back to its pool,
// once the decision is made, so that a request in flight keeps only what
// its response hooks read. Its plugin's PreRequest drops it when no other
// plugin's PreRequest reads it, since their order is the configuration's.
// A value that another plugin's PreRequest reads (the transfer-cost
// decider's snapshot, which p2p-source-producer's PreRequest prices a pull
// with) implements DecisionScoped instead: the director calls
// CycleState.Decided after the decision's last PreRequest and Hold hook,
// and Decided tells each such value to drop it.
//
// Plugins that match prompt prefixes share extproc/prefixmatch, which
// stays outside this package so that the framework knows nothing of them.
package scheduling
