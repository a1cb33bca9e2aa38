// Package servedverifier is GIE's destination-endpoint-served-verifier, a
// plugin of the Gateway API Inference Extension conformance suite: it
// writes the endpoint the proxy reports it served the request from
// (envoy.lb dynamic metadata x-gateway-destination-endpoint-served) into
// the response header x-conformance-test-served-endpoint, so that the
// conformance client can check the proxy honoured the picker's choice. A
// proxy that does not report it gets the header
// "fail: missing destination endpoint served metadata".
//
// It exists for conformance testing: a production configuration should not
// use it.
//
// Parameters: none.
package servedverifier

import (
	"context"
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "destination-endpoint-served-verifier"

// Header is the response header the served endpoint is written to.
const Header = "x-conformance-test-served-endpoint"

// Missing is the header's value when the proxy reported no endpoint.
const Missing = "fail: missing destination endpoint served metadata"

// Verifier implements destination-endpoint-served-verifier.
type Verifier struct{ scheduling.Named }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Verifier{n}, nil
}

// ResponseHeader implements scheduling.ResponseHeader.
func (v *Verifier) ResponseHeader(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, res *scheduling.ResponseHead) {
	if res.Served == "" {
		res.Set(Header, Missing)
		return
	}
	res.Set(Header, res.Served)
}

var _ scheduling.ResponseHeader = (*Verifier)(nil)
