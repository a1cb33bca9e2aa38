package gateway

import (
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvgate/kvgate/internal/eppwire"
	"github.com/kvgate/kvgate/internal/hints"
)

// headerList is a header map in Envoy's shape: ordered, lower-case names,
// pseudo-headers first, repeated names allowed.
type headerList [][2]string

// hopByHop headers describe one connection and are never forwarded.
var hopByHop = map[string]bool{
	"connection": true, "proxy-connection": true, "keep-alive": true, "te": true,
	"trailer": true, "transfer-encoding": true, "upgrade": true,
}

// requestHeaderList builds the Envoy view of r, dropping hop-by-hop headers,
// the client's attempt to pick an upstream and, with stripRewrite, to pick
// the model.
func requestHeaderList(r *http.Request, stripHints, stripRewrite bool) headerList {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	hs := headerList{{":method", r.Method}, {":path", r.URL.RequestURI()}, {":authority", r.Host}, {":scheme", scheme}}
	for name, values := range r.Header {
		lname := strings.ToLower(name)
		if hopByHop[lname] || eppwire.PickerOnly(lname) || lname == "host" || (stripHints && hints.IsHintHeader(lname)) ||
			(stripRewrite && modelRewrite[lname]) {
			continue
		}
		for _, v := range values {
			hs = append(hs, [2]string{lname, v})
		}
	}
	return hs
}

func (hs headerList) get(name string) (string, bool) {
	for _, kv := range hs {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// without returns a copy of hs minus every name header; hs is unchanged.
func (hs headerList) without(name string) headerList {
	out := make(headerList, 0, len(hs))
	for _, kv := range hs {
		if kv[0] != name {
			out = append(out, kv)
		}
	}
	return out
}

func (hs headerList) proto() *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, len(hs))}
	for i, kv := range hs {
		m.Headers[i] = &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])}
	}
	return m
}

// toHTTP copies the regular (non-pseudo) headers into h.
func (hs headerList) toHTTP(h http.Header) {
	for _, kv := range hs {
		if strings.HasPrefix(kv[0], ":") || hopByHop[kv[0]] {
			continue
		}
		h.Add(kv[0], kv[1])
	}
}

func responseHeaderList(resp *http.Response) headerList {
	hs := headerList{{":status", strconv.Itoa(resp.StatusCode)}}
	for name, values := range resp.Header {
		lname := strings.ToLower(name)
		if hopByHop[lname] {
			continue
		}
		for _, v := range values {
			hs = append(hs, [2]string{lname, v})
		}
	}
	return hs
}

func trailerList(t http.Header) headerList {
	var hs headerList
	for name, values := range t {
		for _, v := range values {
			hs = append(hs, [2]string{strings.ToLower(name), v})
		}
	}
	return hs
}

// mutable says whether the processor may change a header: like Envoy's
// default mutation rules, pseudo-headers and host are off limits.
func mutable(name string) bool {
	return name != "" && !strings.HasPrefix(name, ":") && name != "host"
}

// apply performs a header mutation the way Envoy's ext_proc filter does.
func (hs headerList) apply(m *extprocv3.HeaderMutation) headerList {
	if m == nil {
		return hs
	}
	for _, name := range m.GetRemoveHeaders() {
		if name = strings.ToLower(name); mutable(name) {
			hs = hs.without(name)
		}
	}
	for _, o := range m.GetSetHeaders() {
		h := o.GetHeader()
		name := strings.ToLower(h.GetKey())
		if !mutable(name) {
			continue
		}
		value := h.GetValue()
		if len(h.GetRawValue()) > 0 {
			value = string(h.GetRawValue())
		}
		action := o.GetAppendAction()
		if action == corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD {
			// The enum's zero, so also what an unset append_action reads
			// as; ext_proc's HeaderMutation makes append default to false
			// (GIE's picker sets content-length that way). append=true is
			// how a picker appends.
			action = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		}
		if o.GetAppend() != nil {
			// The deprecated bool wins when present, as in Envoy.
			action = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
			if o.GetAppend().GetValue() {
				action = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
			}
		}
		_, exists := hs.get(name)
		switch action {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			hs = append(hs, [2]string{name, value})
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				hs = append(hs, [2]string{name, value})
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			hs = append(hs.without(name), [2]string{name, value})
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				hs = append(hs.without(name), [2]string{name, value})
			}
		}
	}
	return hs
}

// modelRewrite are the headers that make the picker serve another model
// than the body names: GIE's, set by an HTTPRoute filter, and llm-d's. A
// client sending them would choose the model itself.
var modelRewrite = map[string]bool{
	eppwire.HeaderModelRewrite:           true,
	eppwire.HeaderModelRewriteDeprecated: true,
}
