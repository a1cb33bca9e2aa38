// Package latencyslo is the latency-slo-admitter: it refuses a sheddable
// request (priority below zero) that carries a latency SLO no candidate can
// meet — by the cautious (quantile) predictions of the
// predicted-latency-producer — so that it gets a 429 at once instead of
// queueing for an answer that would come too late. A candidate that is
// idle (no request in the live load) or cold (KV cache under 2% used)
// always admits: there the prediction rests on the least evidence.
// Requests that are not sheddable, carry no SLO, or have no predictions are
// admitted.
//
// Parameters: none.
package latencyslo

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/latency"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "latency-slo-admitter"

// coldKVUsage is the KV-cache use below which an endpoint counts as cold.
const coldKVUsage = 0.02

// ErrSLOUnattainable is the refusal.
var ErrSLOUnattainable = errors.New("no endpoint is predicted to meet the request's latency SLO")

// Admitter implements latency-slo-admitter.
type Admitter struct{ scheduling.Named }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Admitter{n}, nil
}

// Consumes implements scheduling.DataDependencies: admitters run after
// every producer, so this only documents the input.
func (a *Admitter) Consumes() []string { return []string{latency.PredictionsKey.String()} }

// Produces implements scheduling.DataDependencies.
func (a *Admitter) Produces() []string { return nil }

// Admit implements scheduling.Admitter.
func (a *Admitter) Admit(_ context.Context, cs *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) error {
	slo := latency.SLOOf(req)
	preds, ok := scheduling.Read(cs, latency.PredictionsKey)
	if !flowcontrol.Sheddable(req.Priority) || !slo.Set() || !ok {
		return nil
	}
	for _, e := range eps {
		if e.Load().Requests() == 0 || e.Metrics().KVCacheUsage < coldKVUsage {
			return nil
		}
	}
	admit := false
	preds.Align(eps, func(_, k int) {
		if _, meets := preds.Headroom(k, slo, 1, 1); meets {
			admit = true
		}
	})
	if admit {
		return nil
	}
	return ErrSLOUnattainable
}

var _ scheduling.Admitter = (*Admitter)(nil)
