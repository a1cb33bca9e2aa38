// Package inflightload is the inflight-load-producer: once per request it
// snapshots every candidate's live load (the picker's own account of the
// requests it routed — prefill backlog and decode load — reconciled with
// the last scrape, see extproc/endpoints) into the cycle state, so that the
// latency predictor sees one set of numbers for every candidate even while
// responses change the account concurrently. (The other plugins read the
// live account directly.)
//
// The account itself is kept by the picker for every request whether or not
// this plugin is configured; the llm-d metrics inflight_requests and
// inflight_tokens come from it too.
//
// Parameters: none.
package inflightload

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "inflight-load-producer"

// Key is where the snapshot is left for the request's other plugins, until
// the decision: the producer's PreRequest drops it.
var Key = scheduling.NewKey[*endpoints.Loads]("inflight-load")

// Producer implements inflight-load-producer.
type Producer struct{ scheduling.Named }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Producer{n}, nil
}

// Produce implements scheduling.DataProducer.
func (p *Producer) Produce(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) {
	l := &endpoints.Loads{Candidates: eps, Loads: make([]endpoints.Load, len(eps))}
	for i, e := range eps {
		l.Loads[i] = e.Load()
	}
	scheduling.Write(cs, Key, l)
}

// PreRequest implements scheduling.PreRequest: the snapshot's reader is the
// latency producer's Produce, so the decision drops it, rather than let a
// streaming response keep a load per candidate until it ends.
func (p *Producer) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Result) {
	if l, ok := scheduling.Read(cs, Key); ok && l != nil {
		*l = endpoints.Loads{}
	}
}

// Produces implements scheduling.DataDependencies.
func (p *Producer) Produces() []string { return []string{Key.String()} }

// Consumes implements scheduling.DataDependencies.
func (p *Producer) Consumes() []string { return nil }

var (
	_ scheduling.DataProducer = (*Producer)(nil)
	_ scheduling.PreRequest   = (*Producer)(nil)
)
