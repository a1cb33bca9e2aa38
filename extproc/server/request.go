package server

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/openai"
)

// newRequest builds the Request from Envoy's request headers and the
// metadata that came with them. generated reports whether the ID was made
// here.
func newRequest(hm *corev3.HeaderMap, md *corev3.Metadata) (req *Request, generated bool) {
	h := headerMap(hm)
	// Only the picker names the destination and the prefiller; a
	// client-sent value must not reach anything that might trust it (llm-d's
	// P/D routing sidecar sends the prompt to the prefiller it names).
	delete(h, eppwire.HeaderDestination)
	delete(h, eppwire.HeaderPrefiller)
	req = &Request{
		ID:           h[eppwire.HeaderRequestID],
		Method:       h[":method"],
		Path:         h[":path"],
		Headers:      h,
		FairnessID:   either(h, eppwire.HeaderFairnessID, eppwire.HeaderFairnessIDDeprecated),
		Objective:    either(h, eppwire.HeaderObjective, eppwire.HeaderObjectiveDeprecated),
		ModelRewrite: either(h, eppwire.HeaderModelRewrite, eppwire.HeaderModelRewriteDeprecated),
		SubsetHint:   subsetHint(md),
	}
	if req.ID == "" {
		req.ID, generated = uuid.NewString(), true
	}
	if req.FairnessID == "" {
		req.FairnessID = DefaultFairnessID
	}
	if api, ok := openai.APIFromPath(req.Path); ok {
		req.API = api
	}
	return req, generated
}

// either is the header canonical, or deprecated when canonical is absent
// or empty: llm-d's name wins over GIE's when a request sends both.
func either(h map[string]string, canonical, deprecated string) string {
	if v := h[canonical]; v != "" {
		return v
	}
	return h[deprecated]
}

// headerMap flattens Envoy's header list: lower-case names, the value from
// raw_value when value is empty (Envoy sends raw_value by default), and
// repeated headers joined with a comma as HTTP allows.
func headerMap(hm *corev3.HeaderMap) map[string]string {
	hs := hm.GetHeaders()
	m := make(map[string]string, len(hs))
	for _, hv := range hs {
		k := strings.ToLower(hv.GetKey())
		v := hv.GetValue()
		if v == "" {
			v = string(hv.GetRawValue())
		}
		if prev, ok := m[k]; ok {
			v = prev + "," + v
		}
		m[k] = v
	}
	return m
}

// subsetHint reads envoy.lb.subset_hint / x-gateway-destination-endpoint-subset:
// nil when absent, a non-nil (possibly empty) list when present. A list of
// strings is the protocol; a single comma-separated string is accepted too.
// Anything else names no endpoint, which fails closed (the Director answers
// 503) rather than silently widening the set.
func subsetHint(md *corev3.Metadata) []string {
	ns, ok := md.GetFilterMetadata()[eppwire.MetadataSubsetHint]
	if !ok {
		return nil
	}
	v, ok := ns.GetFields()[eppwire.MetadataSubsetKey]
	if !ok {
		return nil
	}
	out := []string{}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s := strings.TrimSpace(e.GetStringValue()); s != "" {
				out = append(out, s)
			}
		}
	case *structpb.Value_StringValue:
		for s := range strings.SplitSeq(k.StringValue, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// servedEndpoint reads the endpoint Envoy reports it connected to.
func servedEndpoint(md *corev3.Metadata) string {
	ns, ok := md.GetFilterMetadata()[eppwire.MetadataLB]
	if !ok {
		return ""
	}
	return ns.GetFields()[eppwire.MetadataServedKey].GetStringValue()
}
