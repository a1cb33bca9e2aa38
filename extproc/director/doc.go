// Package director is the picker's request lifecycle between the ext_proc
// server and the scheduler: it turns a parsed request into a scheduling
// request, applies the proxy's subset hint and load shedding, runs the
// scheduler and the PreRequest hooks, charges the chosen endpoint's
// in-flight counters, and on the response side measures TTFT, TPOT and
// inter-chunk latency, releases the in-flight charge and feeds the
// ResponseComplete hooks.
//
// Ownership: a Director is shared by all streams and holds no per-request
// state of its own; each request's state lives in server.Request.State and
// is touched only by that request's stream goroutine.
package director
