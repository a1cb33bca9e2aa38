package server

import (
	"errors"
	"fmt"
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
func newRequest(h map[string]string, md *corev3.Metadata) (req *Request, generated bool) {
	// Only the picker names the destination, the prefiller, the encoders
	// and the KV source; a client-sent value must not reach anything that
	// might trust it (llm-d's P/D routing sidecar sends the prompt where
	// they say).
	for _, name := range eppwire.PickerOnlyHeaders() {
		delete(h, name)
	}
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

// headerLimits bound the header list of one message, as Envoy's
// max_headers_count and max_request_headers_kb do at its listener: a
// client talking to the picker directly must not cost it more than a
// proxy would let through.
type headerLimits struct {
	count int // headers, pseudo-headers included
	bytes int // names plus values
}

// errHeadersTooLarge is headerMap's answer to a list over the limits.
var errHeadersTooLarge = errors.New("headers exceed the limits")

// headerMap flattens Envoy's header list: lower-case names, the value from
// raw_value when value is empty (Envoy sends raw_value by default), and
// repeated headers joined with a comma as HTTP allows. The list is checked
// against lim before anything is copied, and repeats are joined once at the
// end, so the cost is linear in the list's size whatever its shape.
func headerMap(hm *corev3.HeaderMap, lim headerLimits) (map[string]string, error) {
	hs := hm.GetHeaders()
	if len(hs) > lim.count {
		return nil, fmt.Errorf("%w: %d headers, at most %d", errHeadersTooLarge, len(hs), lim.count)
	}
	size := 0
	for _, hv := range hs {
		size += len(hv.GetKey()) + len(hv.GetValue()) + len(hv.GetRawValue())
	}
	if size > lim.bytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", errHeadersTooLarge, size, lim.bytes)
	}
	m := make(map[string]string, len(hs))
	var repeated map[string][]string
	for _, hv := range hs {
		k := strings.ToLower(hv.GetKey())
		v := hv.GetValue()
		if v == "" {
			v = string(hv.GetRawValue())
		}
		prev, seen := m[k]
		if !seen {
			m[k] = v
			continue
		}
		if repeated == nil {
			repeated = map[string][]string{}
		}
		if repeated[k] == nil {
			repeated[k] = []string{prev}
		}
		repeated[k] = append(repeated[k], v)
	}
	for k, vs := range repeated {
		m[k] = strings.Join(vs, ",")
	}
	return m, nil
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
