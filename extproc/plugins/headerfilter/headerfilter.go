// Package headerfilter is GIE's header-based-testing-filter, the filter of
// the Gateway API Inference Extension conformance suite: it keeps only the
// endpoints the request names in its test-epp-endpoint-selection header, a
// comma list of IPs (any port of that IP) or ip:port (that port only). A
// request without the header keeps nothing, so that a conformance run
// cannot pass by accident. Candidates keep their order (kvgate's filters
// return a subsequence); a value naming no candidate is skipped.
//
// It exists for conformance testing: a production profile should not use it.
//
// Parameters: none.
package headerfilter

import (
	"context"
	"encoding/json"
	"net"
	"strings"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "header-based-testing-filter"

// Header is the request header naming the endpoints to keep.
const Header = "test-epp-endpoint-selection"

// Filter implements header-based-testing-filter.
type Filter struct{ scheduling.Named }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Filter{n}, nil
}

// Filter implements scheduling.Filter.
func (f *Filter) Filter(_ context.Context, _ *scheduling.CycleState, req *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	hosts, hostPorts := selection(req.Headers[Header])
	kept := eps[:0]
	for _, e := range eps {
		host, port, err := net.SplitHostPort(e.Address())
		if err != nil {
			continue
		}
		if hosts[host] || hostPorts[net.JoinHostPort(host, port)] {
			kept = append(kept, e)
		}
	}
	return kept
}

// selection parses the header: bare hosts, and host:port pairs (in
// net.JoinHostPort's form, so that "[::1]:8000" and an endpoint at ::1
// port 8000 meet).
func selection(v string) (hosts, hostPorts map[string]bool) {
	hosts, hostPorts = map[string]bool{}, map[string]bool{}
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if h, p, err := net.SplitHostPort(item); err == nil {
			hostPorts[net.JoinHostPort(strings.Trim(h, "[]"), p)] = true
			continue
		}
		hosts[strings.Trim(item, "[]")] = true
	}
	return hosts, hostPorts
}

var _ scheduling.Filter = (*Filter)(nil)
