package scheduling

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/internal/openai"
)

// Plugin is anything built from configuration.
type Plugin interface {
	// TypedName is the plugin's registered type and its configured name.
	TypedName() TypedName
}

// TypedName identifies a plugin instance.
type TypedName struct {
	Type string
	Name string
}

func (t TypedName) String() string {
	if t.Name == "" || t.Name == t.Type {
		return t.Type
	}
	return t.Name + "/" + t.Type
}

// Filter narrows the candidate set. It returns the kept endpoints, in order;
// it may reuse the input slice's backing array.
type Filter interface {
	Plugin
	Filter(ctx context.Context, cs *CycleState, req *Request, candidates []*endpoints.Endpoint) []*endpoints.Endpoint
}

// Scorer rates every candidate in [0, 1]: scores[i] belongs to candidates[i]
// and is zero on entry.
type Scorer interface {
	Plugin
	Score(ctx context.Context, cs *CycleState, req *Request, candidates []*endpoints.Endpoint, scores []float64)
}

// Picker chooses targets from scored candidates. It may reorder scored.
type Picker interface {
	Plugin
	Pick(ctx context.Context, cs *CycleState, req *Request, scored []ScoredEndpoint) *ProfileResult
}

// ProfileHandler decides which profiles run and which result is primary. The
// scheduler calls Pick repeatedly with the results so far until it returns no
// profile, then ProcessResults. This shape lets a P/D handler run "decode",
// look at its choice, and only then decide whether to run "prefill".
type ProfileHandler interface {
	Plugin
	Pick(ctx context.Context, cs *CycleState, req *Request, profiles map[string]*Profile, results map[string]*ProfileResult) []*Profile
	ProcessResults(ctx context.Context, cs *CycleState, req *Request, results map[string]*ProfileResult) (*Result, error)
}

// ProfileValidator is implemented by profile handlers that constrain which
// profiles a configuration may define (the P/D handler needs "prefill" and
// "decode"); configuration loading calls it.
type ProfileValidator interface {
	ValidateProfiles(names []string) error
}

// PreRequest runs after a decision and before the request is forwarded:
// plugins record what they routed (prefix indexes, in-flight load) or add
// headers to the result.
type PreRequest interface {
	Plugin
	PreRequest(ctx context.Context, cs *CycleState, req *Request, res *Result)
}

// Holder may keep a routed request in the picker after its PreRequest
// hooks, before it is forwarded: release is closed when it may go (nil:
// it need not wait), and it waits at most max. A request given up while
// held (its client gone) ends like any other: its ResponseComplete hooks
// run.
type Holder interface {
	Plugin
	Hold(cs *CycleState) (release <-chan struct{}, max time.Duration)
}

// Response is the outcome of a routed request as the proxy saw it.
type Response struct {
	// Endpoint is the endpoint that served it (the primary unless the proxy
	// reported a fallback).
	Endpoint *endpoints.Endpoint
	Status   int
	Usage    openai.Usage
	// Complete is false when the stream ended early (client gone, reset).
	Complete bool
	// TTFT is from the request's arrival to its first response chunk; TPOT
	// the mean gap between output tokens of a streamed response (zero until
	// known, and for responses that do not show it).
	TTFT, TPOT time.Duration
}

// ResponseComplete observes the end of every routed request exactly once.
type ResponseComplete interface {
	Plugin
	ResponseComplete(ctx context.Context, cs *CycleState, req *Request, res *Response)
}

// EndpointsRemoved is implemented by plugins that keep per-endpoint state,
// so that the state of endpoints leaving the pool is dropped. Per-endpoint
// state is keyed by address (ip:port), the identity the proxy, the KV events
// and the KV index all speak; a name can move to another address.
type EndpointsRemoved interface {
	Plugin
	EndpointsRemoved(addresses []string)
}
