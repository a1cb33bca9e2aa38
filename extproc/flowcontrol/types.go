package flowcontrol

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// Request is what flow control knows of a request: its flow, its size and
// its timing. The caller fills it; the Controller does not modify it.
type Request struct {
	ID         string
	FairnessID string
	Priority   int
	// Model and TargetModel label the queue metrics.
	Model, TargetModel string
	// Bytes is the request body's size, counted against maxBytes.
	Bytes int64
	// ReceivedAt is when the gateway received it: slo-deadline ordering
	// counts its objective from here.
	ReceivedAt time.Time
	// TTFTSLO is the x-llm-d-slo-ttft-ms objective; zero when none.
	TTFTSLO time.Duration
	// Deadline is the client's own deadline (a context deadline), zero when
	// none: edf ordering takes the sooner of it and the queue's TTL.
	Deadline time.Time
	// Payload is the caller's, carried to the dispatch unchanged.
	Payload any
}

// Sheddable reports whether a request of this priority may be shed or
// evicted first: llm-d's convention, priority below zero.
func Sheddable(priority int) bool { return priority < 0 }

// Outcome is a request's final state in the layer, named as llm-d's
// flow_control_* metrics label it.
type Outcome uint8

// Outcomes.
const (
	Dispatched Outcome = iota
	RejectedCapacity
	RejectedNoEndpoints
	RejectedOther
	EvictedTTL
	EvictedNoEndpoints
	EvictedContextCancelled
	EvictedOther
)

var outcomeNames = [...]string{"Dispatched", "RejectedCapacity", "RejectedNoEndpoints", "RejectedOther", "EvictedTTL", "EvictedNoEndpoints", "EvictedContextCancelled", "EvictedOther"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

// Error is a request the layer did not dispatch.
type Error struct {
	Outcome Outcome
	// ShuttingDown marks a rejection or eviction by a controller that is
	// stopping.
	ShuttingDown bool
	// PoolEmpty reports that the pool had no endpoints when it happened.
	PoolEmpty bool
	Msg       string
}

func (e *Error) Error() string {
	if e.Msg != "" {
		return "flow control: " + e.Outcome.String() + ": " + e.Msg
	}
	return "flow control: " + e.Outcome.String()
}

// ErrShuttingDown is the message of requests refused by a stopping
// controller.
var ErrShuttingDown = errors.New("flow controller is shutting down")

// Pool lists the endpoints requests are dispatched to.
type Pool interface {
	Candidates() []*endpoints.Endpoint
}

// SaturationDetector measures how full a set of endpoints is: 1.0 is the
// gating set point, values above it say by how much it is oversubscribed.
// It must be safe for concurrent use.
type SaturationDetector interface {
	Saturation(eps []*endpoints.Endpoint) float64
}

// StaleCounter is implemented by detectors that fail closed on stale
// metrics: how many of eps they scored as saturated for that reason.
type StaleCounter interface {
	StaleEndpoints(eps []*endpoints.Endpoint) int
}

// ReclaimCredit is implemented by detectors that can say how much one
// in-flight request adds to the saturation of eps: eviction sizes its
// revocations with it.
type ReclaimCredit interface {
	Credit(eps []*endpoints.Endpoint) float64
}

// Band is a priority band as a fairness policy sees it.
type Band struct {
	b *band
}

// Priority is the band's priority.
func (b Band) Priority() int { return b.b.priority }

// Flows are the band's flows that hold requests, by fairness id.
func (b Band) Flows() []*Flow { return b.b.active }

// Less orders two requests by the band's ordering policy.
func (b Band) Less(x, y *Item) bool { return b.b.ordering.Less(x, y) }

// Now is the dispatch cycle's time.
func (b Band) Now() time.Time { return b.b.c.now }

// Cursor is per-band state a fairness policy may keep between picks (a
// round-robin position); the band owns it, the policy alone reads and writes it.
func (b Band) Cursor() *string { return &b.b.cursor }

// FairnessPolicy chooses which flow of a band dispatches next. Policies are
// called with the Controller's lock held, one call at a time.
type FairnessPolicy interface {
	// Pick returns one of b.Flows(), never nil when there is one.
	Pick(b Band) *Flow
}

// OrderingPolicy orders the requests of a flow (and, for
// global-strict-fairness-policy, the heads of a band's flows).
type OrderingPolicy interface {
	// Less reports whether x is dispatched before y.
	Less(x, y *Item) bool
}

// UsageLimitPolicy turns the pool's saturation into a dispatch ceiling per
// band: band i (priorities[0] is the highest) dispatches only while
// saturation < ceilings[i]. ceilings arrive filled with 1.0.
type UsageLimitPolicy interface {
	Ceilings(saturation float64, priorities []int, ceilings []float64)
}

// FlowKey identifies a flow.
type FlowKey struct {
	FairnessID string
	Priority   int
}
