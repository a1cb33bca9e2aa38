// Package multiclusteraffinity is llm-d's
// multicluster-session-affinity-filter: llm-d's session-affinity-filter
// for a picker whose endpoints are peer clusters, pinning a session to the
// cluster that served it. It is kvgate's session-affinity-scorer
// (extproc/plugins/sessionaffinity, the same strategies, headers, tokens
// and bindings) applied as a hard constraint: when the session's cluster is
// a candidate it is the only one kept; a request without a session, or
// whose cluster is no candidate, keeps every candidate (never an empty
// set), and is bound to wherever it goes.
//
// Parameters (session-affinity-scorer's, llm-d's filter names):
//
//	strategy: string        encoded_endpoint_header (default) or session_id
//	profileName: string     profile whose target a session binds to
//	                        (default: the primary profile's)
//	sessionIdConfig: object  sources (list of {header}; default
//	                        x-session-id), evictionTtlSeconds (300),
//	                        evictionSweepSeconds (10)
//	encodedEndpointHeaderConfig: object  header (x-session-token)
package multiclusteraffinity

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/sessionaffinity"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "multicluster-session-affinity-filter"

// Filter implements multicluster-session-affinity-filter.
type Filter struct {
	scheduling.Named
	inner *sessionaffinity.Scorer
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	n := scheduling.NewNamed(Type, name)
	p, err := sessionaffinity.New(n.TypedName().Name, raw, h)
	if err != nil {
		return nil, err
	}
	return &Filter{Named: n, inner: p.(*sessionaffinity.Scorer)}, nil
}

// Filter implements scheduling.Filter: the candidates the session affinity
// prefers, or all when it prefers none.
func (f *Filter) Filter(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	scores := make([]float64, len(eps))
	f.inner.Score(ctx, cs, req, eps, scores)
	var kept []*endpoints.Endpoint
	for i, e := range eps {
		if scores[i] > 0 {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		return eps
	}
	return kept
}

// PreRequest implements scheduling.PreRequest: the session is bound to
// where the request goes.
func (f *Filter) PreRequest(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.Result) {
	f.inner.PreRequest(ctx, cs, req, res)
}

// ResponseHeader implements scheduling.ResponseHeader: the
// encoded_endpoint_header token goes back to the client.
func (f *Filter) ResponseHeader(ctx context.Context, cs *scheduling.CycleState, req *scheduling.Request, res *scheduling.ResponseHead) {
	f.inner.ResponseHeader(ctx, cs, req, res)
}

// EndpointsRemoved implements scheduling.EndpointsRemoved.
func (f *Filter) EndpointsRemoved(addresses []string) { f.inner.EndpointsRemoved(addresses) }

var (
	_ scheduling.Filter           = (*Filter)(nil)
	_ scheduling.PreRequest       = (*Filter)(nil)
	_ scheduling.ResponseHeader   = (*Filter)(nil)
	_ scheduling.EndpointsRemoved = (*Filter)(nil)
)
