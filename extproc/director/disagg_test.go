package director

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
)

const pdConfig = `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: prefill-filter
- type: decode-filter
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 20}
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: prefix-based-pd-decider}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: prefix-cache-scorer}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer}]
`

// pdDirector is a director built from yaml over a prefill server p and a
// decode server dd.
func pdDirector(t *testing.T, yaml string) (d *Director, p, dd *endpoints.Endpoint) {
	t.Helper()
	built := buildConfig(t, yaml, &scheduling.Handle{Services: map[string]any{}})
	p = schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill")
	dd = schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode")
	d = New(Options{Pool: pool{p, dd}, Scheduler: built.Scheduler,
		Hooks: Hooks{PreRequest: built.PreRequest, FirstToken: built.FirstToken, ResponseComplete: built.ResponseComplete}})
	return d, p, dd
}

// A P/D decision sends the request to the decode server and names the
// prefill server for its sidecar; once the decode server holds the
// prompt, the decider keeps the next one local. Prefer: if-available is
// refused with 412 while no decode server holds any of the prompt.
func TestDisaggregationDecision(t *testing.T) {
	d, p, dd := pdDirector(t, pdConfig)
	ctx := context.Background()
	prompt := "a long prompt that the decode server has never seen before, many tokens of it, enough for several blocks"

	cond := completion(prompt, true)
	cond.Headers[eppwire.HeaderPrefer] = "respond-async, If-Available ;x=1"
	var ie *inferr.Error
	if _, _, err := d.HandleRequest(ctx, cond); !errors.As(err, &ie) || ie.HTTPStatus() != 412 {
		t.Fatalf("conditional decode of a cold prompt: %v, want 412", err)
	}

	dec, ex, err := d.HandleRequest(ctx, completion(prompt, true))
	if err != nil {
		t.Fatal(err)
	}
	if dec.Endpoints[0] != dd.Address() || dec.Headers[eppwire.HeaderPrefiller] != p.Address() {
		t.Fatalf("cold prompt: endpoints %v headers %v, want decode %s with prefiller %s", dec.Endpoints, dec.Headers, dd.Address(), p.Address())
	}
	// The live load: the prompt's work on the prefill server until the
	// first token, the decode server only waiting for the KV.
	if pl, dl := p.Load(), dd.Load(); pl.PrefillRequests != 1 || pl.PrefillTokens <= 0 || dl.PrefillRequests != 1 || dl.PrefillTokens != 0 {
		t.Fatalf("after the decision: prefill %+v, decode %+v", pl, dl)
	}
	ex.ResponseStarted(ctx, server.ResponseHead{Status: 200})
	ex.ResponseChunk(ctx, []byte("data: {}\n\n"))
	if pl, dl := p.Load(), dd.Load(); pl != (endpoints.Load{}) || dl.DecodeRequests != 1 || p.InflightRequests() != 0 {
		t.Fatalf("after the first token: prefill %+v, decode %+v", pl, dl)
	}
	ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true})
	if dl := dd.Load(); dl != (endpoints.Load{}) {
		t.Fatalf("after the end: decode %+v", dl)
	}

	cond = completion(prompt, true)
	cond.Headers[eppwire.HeaderPrefer] = "if-available"
	dec, ex, err = d.HandleRequest(ctx, cond)
	if err != nil {
		t.Fatalf("conditional decode of a held prompt: %v", err)
	}
	if _, ok := dec.Headers[eppwire.HeaderPrefiller]; ok || dec.Endpoints[0] != dd.Address() {
		t.Fatalf("held prompt: endpoints %v headers %v, want decode only", dec.Endpoints, dec.Headers)
	}
	ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true})
}

const transferCostConfig = `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: transfer-cost-pd-decider
  parameters: {prefillTokensPerSecond: 1000, decodeStep: 10ms}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: transfer-cost-pd-decider}}
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: transfer-cost-pd-decider}]
`

// A P/D request's remote charge carries the prefill's finish that the
// transfer-cost decider predicted: the prefill server's backlog counts it
// until then and not after (its KV on the wire), and the first token
// releases it from both at once.
func TestRemoteChargeCarriesPredictedFinish(t *testing.T) {
	d, p, dd := pdDirector(t, transferCostConfig)
	// A decoding batch on d, which a local prefill would stall.
	for range 32 {
		c := dd.Charge(0, 512, 768, 768)
		c.FirstToken()
		t.Cleanup(c.Release)
	}
	ctx := context.Background()
	decided := time.Now()
	dec, ex, err := d.HandleRequest(ctx, completion(strings.Repeat("a long prompt nobody holds yet ", 400), true))
	if err != nil {
		t.Fatal(err)
	}
	if dec.Headers[eppwire.HeaderPrefiller] != p.Address() {
		t.Fatalf("not disaggregated: endpoints %v headers %v", dec.Endpoints, dec.Headers)
	}
	charged := p.Load().PrefillTokens
	// At 1000 tokens/s the prompt's prefill takes seconds: not computed
	// at the decision, computed a minute later.
	if tokens, _ := p.PrefillBacklog(decided); charged <= 0 || tokens != charged {
		t.Fatalf("at the decision: backlog %d of %d charged, want all", tokens, charged)
	}
	if tokens, attention := p.PrefillBacklog(decided.Add(time.Minute)); tokens != 0 || attention != 0 {
		t.Fatalf("past the predicted finish: backlog %d tokens, %d pairs, want none", tokens, attention)
	}
	ex.ResponseStarted(ctx, server.ResponseHead{Status: 200})
	ex.ResponseChunk(ctx, []byte("data: {}\n\n"))
	if l := p.Load(); l != (endpoints.Load{}) {
		t.Fatalf("after the first token: prefill server %+v", l)
	}
	if tokens, _ := p.PrefillBacklog(decided); tokens != 0 {
		t.Fatalf("after the first token: backlog %d", tokens)
	}
	ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true})
}
