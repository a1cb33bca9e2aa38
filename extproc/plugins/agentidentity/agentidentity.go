// Package agentidentity is llm-d's agent-identity: it gives every turn of
// an AI agent's session one flow-control fairness id, from the session
// header the agent sends, so that one agent's session queues in one flow.
// It reads, in order, the additionalSessionHeaders, then
// x-claude-code-session-id (Claude Code), x-session-affinity (OpenCode),
// session-id and session_id (Codex), and the first non-empty value becomes
// the request's fairness id. An explicit fairness header
// (x-llm-d-inference-fairness-id, or GIE's x-gateway-inference-fairness-id)
// always wins; a request with neither keeps the default flow. (llm-d keeps
// the identity as a request attribute for its director to copy; kvgate has
// no other consumer of it and sets the fairness id directly.)
//
// Parameters:
//
//	additionalSessionHeaders: []string  header names checked before the built-in ones, in order (default none)
package agentidentity

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// Type is the registered plugin type.
const Type = "agent-identity"

// SessionHeaders are the agents' session headers, checked after the
// configured ones.
var SessionHeaders = []string{"x-claude-code-session-id", "x-session-affinity", "session-id", "session_id"}

// maxHeaders bounds the configured list: each is a map lookup per request.
const maxHeaders = 64

// Params are the plugin's parameters.
type Params struct {
	AdditionalSessionHeaders []string `json:"additionalSessionHeaders"`
}

// Plugin implements agent-identity.
type Plugin struct {
	scheduling.Named
	headers []string
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if len(p.AdditionalSessionHeaders) > maxHeaders {
		return nil, fmt.Errorf("parameters.additionalSessionHeaders: at most %d headers, got %d", maxHeaders, len(p.AdditionalSessionHeaders))
	}
	a := &Plugin{Named: scheduling.NewNamed(Type, name)}
	for i, h := range p.AdditionalSessionHeaders {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" {
			return nil, fmt.Errorf("parameters.additionalSessionHeaders[%d] is empty", i)
		}
		a.headers = append(a.headers, h)
	}
	a.headers = append(a.headers, SessionHeaders...)
	return a, nil
}

// Identity is the session identity req's headers carry; "" for none.
func (a *Plugin) Identity(headers map[string]string) string {
	for _, h := range a.headers {
		if v := strings.TrimSpace(headers[h]); v != "" {
			return v
		}
	}
	return ""
}

// RequestHeader implements scheduling.RequestHeader.
func (a *Plugin) RequestHeader(_ context.Context, req *scheduling.Request) {
	if req.Headers[eppwire.HeaderFairnessID] != "" || req.Headers[eppwire.HeaderFairnessIDDeprecated] != "" {
		return
	}
	if id := a.Identity(req.Headers); id != "" {
		req.FairnessID = id
	}
}

var _ scheduling.RequestHeader = (*Plugin)(nil)
