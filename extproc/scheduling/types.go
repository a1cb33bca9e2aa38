package scheduling

import (
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/openai"
)

// Request is what plugins see of an LLM request.
type Request struct {
	// ID is the x-request-id.
	ID string
	// IncomingModel is the model the client asked for; TargetModel is what
	// the model server will receive (after any rewrite). A LoRA adapter is
	// addressed by its name as the target model.
	IncomingModel string
	TargetModel   string
	// Headers are the request headers, lower-case names.
	Headers map[string]string
	// Body is the parsed body; nil on the headers-only path, where the
	// data-plane filter has already extracted what routing needs. It is
	// set until the decision (through the PreRequest hooks): the response
	// hooks see nil, so that a streaming response does not keep the
	// request body in memory.
	Body *openai.Request
	// Prefix is the prompt's prefix block hashes as the wasm filter sent
	// them (headers-only path); nil otherwise.
	Prefix *hints.Prefix
	// PromptTokens is the prompt length in tokens: exact when tokenized,
	// else an estimate.
	PromptTokens int
	// MaxTokens is the requested output bound (0 = unknown).
	MaxTokens int
	// Priority comes from the request's InferenceObjective; negative means
	// sheddable.
	Priority int
	// FairnessID groups requests into flows for fair queuing.
	FairnessID string
	// Stream marks a streaming request.
	Stream bool
	// TTFTSLO and TPOTSLO are the request's latency objectives
	// (x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms); zero when not set.
	TTFTSLO, TPOTSLO time.Duration
}

// TokenEstimate is the work a request brings: prompt plus expected output.
func (r *Request) TokenEstimate() int64 {
	return int64(r.PromptTokens) + int64(r.MaxTokens)
}

// ScoredEndpoint is a candidate with its total weighted score.
type ScoredEndpoint struct {
	Endpoint *endpoints.Endpoint
	Score    float64
}

// ProfileResult is what one profile picked: the primary target first, then
// fallbacks.
type ProfileResult struct {
	Targets []*endpoints.Endpoint
}

// Result is a scheduling decision: every profile that ran and which of them
// is the primary (the one the request is sent to).
type Result struct {
	PrimaryProfile string
	Profiles       map[string]*ProfileResult
	// Prefill is the server that computes the prompt when that is not the
	// primary: a P/D decision's prefill pick, whose KV the primary then
	// receives. Nil when the primary computes its own prompt. The live load
	// model charges the prefill work there.
	Prefill *endpoints.Endpoint
	// Headers are extra request headers plugins want sent upstream (for
	// example x-prefiller-host-port), set during PreRequest.
	Headers map[string]string
	// DestinationPort, when non-zero, is the port the request is sent to
	// on the primary targets' hosts instead of their own: llm-d's
	// data-parallel handler sends each rank's requests to its pod's
	// primary port. The targets stay the ranks (load is charged there).
	DestinationPort int
	// Uncached is the prompt tokens the primary target computes, as the
	// live load charges them (the prompt less what the prefix match says
	// it holds; 0 for P/D), set by the director before the PreRequest
	// hooks, which may release the match's per-candidate state.
	Uncached int
}

// PrefillFinish predicts when a candidate would have computed the
// request's prefill (its queued backlog, then the request's uncached
// prompt); ok is false for one it has no prediction for. A plugin that
// predicts it (transfer-cost-pd-decider) writes it under PrefillFinishKey;
// the director puts the prefill server's on a P/D request's remote charge
// (endpoints.Endpoint.ChargeComputedBy), the one account of that prefill.
type PrefillFinish interface {
	PrefillFinish(e *endpoints.Endpoint) (at time.Time, ok bool)
}

// PrefillFinishKey is where a request's PrefillFinish is written.
var PrefillFinishKey = NewKey[PrefillFinish]("prefill-finish")

// Primary returns the primary profile's result; nil if it picked nothing.
func (r *Result) Primary() *ProfileResult {
	if r == nil {
		return nil
	}
	return r.Profiles[r.PrimaryProfile]
}

// SetHeader records a header to send upstream.
func (r *Result) SetHeader(name, value string) {
	if r.Headers == nil {
		r.Headers = make(map[string]string, 1)
	}
	r.Headers[name] = value
}
