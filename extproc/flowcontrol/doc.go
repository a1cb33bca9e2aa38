// Package flowcontrol is the picker's flow-control layer (llm-d's
// `flowControl` feature gate): it holds requests in memory while the pool is
// saturated and dispatches them, one at a time, as capacity frees.
//
// Dispatch order: priority bands strictly by priority (highest first), then a
// flow inside the band by the band's fairness policy, then a request inside
// the flow by the band's ordering policy. A flow is (fairness id, priority).
// Before each dispatch the saturation detector measures the pool from the
// picker's live load model and the usage-limit policy turns that into a
// ceiling per band; a band whose ceiling the saturation has reached blocks
// the cycle (head-of-line blocking, so lower bands cannot take the capacity
// the blocked one waits for).
//
// Two drivers share one Controller: Gate, the blocking front end the
// director uses in the picker (a dispatcher goroutine woken by enqueues, by
// every release of live load and by a short tick while anything is queued),
// and the cluster benchmark, which calls Controller.Next on its virtual
// clock after every event.
//
// Ownership and bounds: a Controller owns every queued Item under one mutex.
// Queued requests are bounded by the global and per-band maxRequests (every
// band has a bound), bands by MaxBands, flows per band by MaxFlowsPerBand
// (later fairness ids share the flow "other"), and the in-flight sheddable
// requests tracked for eviction by what the model servers hold.
package flowcontrol
