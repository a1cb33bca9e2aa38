package scheduling

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/internal/openai"
)

// DataProducer computes per-request data that later plugins consume (a
// prefix match, latency predictions) once per request, over every candidate,
// before any profile runs. As in llm-d, a producer listed under plugins is
// bound by its capability alone; a profile may also name it, which changes
// nothing.
type DataProducer interface {
	Plugin
	Produce(ctx context.Context, cs *CycleState, req *Request, candidates []*endpoints.Endpoint)
}

// DataDependencies is implemented by producers whose input another producer
// computes: producers run so that every key a producer consumes is produced
// before it, and otherwise in configuration order. A consumed key that no
// configured producer produces is simply absent: consumers treat their
// inputs as optional. Keys are the cycle-state keys' names.
type DataDependencies interface {
	Produces() []string
	Consumes() []string
}

// Admitter may refuse a request before any profile runs, after the data
// producers (it may read their data). A refusal is answered 429 with the
// admitter's reason; only sheddable requests should be refused.
type Admitter interface {
	Plugin
	Admit(ctx context.Context, cs *CycleState, req *Request, candidates []*endpoints.Endpoint) error
}

// Screener narrows the candidates before the data producers, admitters and
// profiles run (llm-d's Screener), so that no later filter, scorer or
// picker can undo the constraint. Every screener sees the same candidates
// (it must not modify the slice); the request goes on with the endpoints
// all of them keep, and fails with ErrScreenedOut when none is left.
type Screener interface {
	Plugin
	Screen(ctx context.Context, cs *CycleState, req *Request, candidates []*endpoints.Endpoint) []*endpoints.Endpoint
}

// ErrScreenedOut is returned when the screeners keep no candidate; it is
// an ErrNoCandidates (llm-d answers 503, reason no-endpoints).
var ErrScreenedOut = fmt.Errorf("%w: the screeners kept none", ErrNoCandidates)

// RequestHeader runs once per request as the picker assembles it, before
// flow control and scheduling (llm-d's RequestHeaderProcessor): plugins
// derive request attributes from the headers, such as the fairness id
// flow control queues the request under.
type RequestHeader interface {
	Plugin
	RequestHeader(ctx context.Context, req *Request)
}

// ErrNotAdmitted wraps an admitter's refusal.
var ErrNotAdmitted = errors.New("request not admitted")

// FirstToken observes a routed request's first response chunk, the moment
// its prefill is over: plugins release prefill-phase state and learn TTFT.
type FirstToken interface {
	Plugin
	FirstToken(ctx context.Context, cs *CycleState, req *Request, res *Response)
}

// Point names of the stages in plugin duration metrics.
const (
	PointDataProducer     = "DataProducer"
	PointAdmitter         = "Admitter"
	PointScreener         = "Screener"
	PointFirstToken       = "FirstToken"
	PointRequestHeader    = "RequestHeader"
	PointResponseHeader   = "ResponseHeader"
	PointResponseMetadata = "ResponseMetadata"
)

// OrderProducers returns producers so that each runs after the producers of
// the keys it consumes, keeping configuration order otherwise. A cycle is a
// configuration error naming a plugin on it.
func OrderProducers(ps []DataProducer) ([]DataProducer, error) {
	// Several producers may produce one key (both prefix scorers): a
	// consumer runs after all of them.
	producers := map[string][]int{}
	for i, p := range ps {
		if d, ok := p.(DataDependencies); ok {
			for _, k := range d.Produces() {
				producers[k] = append(producers[k], i)
			}
		}
	}
	out := make([]DataProducer, 0, len(ps))
	state := make([]uint8, len(ps)) // 0 new, 1 visiting, 2 placed
	var visit func(i int) error
	visit = func(i int) error {
		switch state[i] {
		case 1:
			return fmt.Errorf("data producers depend on each other in a cycle through %s", ps[i].TypedName())
		case 2:
			return nil
		}
		state[i] = 1
		if d, ok := ps[i].(DataDependencies); ok {
			// Dependencies in configuration order, whatever the order
			// of the keys.
			var deps []int
			for _, k := range d.Consumes() {
				deps = append(deps, producers[k]...)
			}
			slices.Sort(deps)
			for _, j := range deps {
				if err := visit(j); err != nil {
					return err
				}
			}
		}
		state[i] = 2
		out = append(out, ps[i])
		return nil
	}
	for i := range ps {
		if err := visit(i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// AlignSubset calls fn(i, k) for each subset[i] found as all[k]. Producers
// index their data by the request's full candidate list; a filter or scorer
// sees the candidates left after filtering, a subsequence in the same order
// (filters keep order), so one merge pass pairs them. An endpoint not in
// all is skipped.
func AlignSubset(all, subset []*endpoints.Endpoint, fn func(i, k int)) {
	j := 0
	for i, e := range subset {
		k := j
		for k < len(all) && all[k] != e {
			k++
		}
		if k == len(all) {
			continue
		}
		fn(i, k)
		j = k + 1
	}
}

// ResponseHead is the start of a routed request's response as plugins see
// it, and the headers they set on it for the client.
type ResponseHead struct {
	Status int
	// Headers are the response's headers, lower-case names.
	Headers map[string]string
	// Served is the endpoint the proxy reports it sent the request to
	// (envoy.lb's x-gateway-destination-endpoint-served); "" when it did
	// not say.
	Served string
	// Endpoint is the endpoint the request is accounted to: the served
	// one when the proxy said, else the primary pick; nil when unknown.
	Endpoint *endpoints.Endpoint
	set      map[string]string
}

// Set sets a response header for the client.
func (r *ResponseHead) Set(name, value string) {
	if r.set == nil {
		r.set = make(map[string]string, 1)
	}
	r.set[name] = value
}

// SetHeaders are the headers plugins set.
func (r *ResponseHead) SetHeaders() map[string]string { return r.set }

// ResponseHeader sees a routed request's response headers and may set
// headers on the response (GIE's ResponseHeader processors).
type ResponseHeader interface {
	Plugin
	ResponseHeader(ctx context.Context, cs *CycleState, req *Request, res *ResponseHead)
}

// Metadata is dynamic metadata for the proxy: namespace → key → a value
// protobuf's Struct holds (a number, string, bool, or nested map or list).
type Metadata map[string]map[string]any

// Set records one value.
func (m Metadata) Set(namespace, key string, v any) {
	if m[namespace] == nil {
		m[namespace] = map[string]any{}
	}
	m[namespace][key] = v
}

// ResponseMetadata reports a routed request's response to the proxy as
// dynamic metadata, once, before the response's last message is passed on
// (GIE's request-attribute-reporter). usage is the response's token usage,
// nil when it carried none.
type ResponseMetadata interface {
	Plugin
	ResponseMetadata(ctx context.Context, cs *CycleState, req *Request, usage *openai.Usage, md Metadata)
}
