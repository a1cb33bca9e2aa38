package epp

import (
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// GIE's request-attribute-reporter integration configuration, with the
// conformance suite's served-endpoint verifier: the response's usage comes
// back to the proxy as envoy.lb dynamic metadata on the last body message,
// and the served endpoint the proxy reports as a response header.
func TestResponseHooks(t *testing.T) {
	const cfg = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: openai-parser
- name: total-tokens-cost-reporter
  type: request-attribute-reporter
  parameters:
    attributes:
    - key:
        namespace: envoy.lb
        name: x-gateway-inference-request-cost
      expression: 'usage.completion_tokens'
      condition: has(usage.completion_tokens)
- type: destination-endpoint-served-verifier
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: openai-parser
  - pluginRef: total-tokens-cost-reporter
parser:
  pluginRef: openai-parser
featureGates:
- enableLegacyMetrics
`
	f := startFleet(t, cfg, vllmMetrics(0, 0, ""))
	s, r := f.route(t, nil, `{"model":"base","prompt":"hi"}`, 1)
	dest := f.destination(t, r)
	s.Recv() // the re-sent body
	s.Send(envoytest.WithMetadata(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "application/json"),
		eppwire.MetadataLB, eppwire.MetadataServedKey, structpb.NewStringValue(dest)))
	hr := s.Recv().GetResponseHeaders()
	var served string
	for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-conformance-test-served-endpoint" {
			served = string(h.GetHeader().GetRawValue())
		}
	}
	if served != dest {
		t.Fatalf("served header %q, want %q", served, dest)
	}
	s.Send(envoytest.ResponseBody([]byte(`{"id":"c","choices":[{"text":"x"}],`), false))
	if md := s.Recv().GetDynamicMetadata(); md != nil {
		t.Fatalf("metadata before the end: %v", md)
	}
	s.Send(envoytest.ResponseBody([]byte(`"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`), true))
	last := s.Recv()
	cost := last.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-inference-request-cost"]
	if cost.GetNumberValue() != 9 {
		t.Fatalf("dynamic metadata %v, want envoy.lb x-gateway-inference-request-cost 9", last.GetDynamicMetadata())
	}
}
