// Package director is the picker's request lifecycle between the ext_proc
// server and the scheduler: it turns a parsed request into a scheduling
// request, passes it through the flow-control layer when one is configured
// (Admission: the request waits there until dispatched, and is then
// scheduled on the dispatcher's goroutine), applies the proxy's subset hint
// and, without flow control, load shedding, runs the
// scheduler, the PreRequest and Hold hooks (then tells the cycle state
// the decision is made: scheduling.CycleState.Decided), charges the chosen endpoint's
// in-flight counters, and on the response side measures TTFT, TPOT and
// inter-chunk latency, releases the in-flight charge and feeds the
// ResponseComplete hooks.
//
// Ownership: a Director is shared by all streams and holds no per-request
// state of its own; each request's state lives in server.Request.State and
// is touched only by that request's stream goroutine.
package director
