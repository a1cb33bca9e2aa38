package director

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// Every flow-control outcome reaches the client as llm-d's router answers
// it (admission.go translateFlowControlOutcome): status and
// x-llm-d-request-dropped-reason.
func TestFlowErrorLikeLLMD(t *testing.T) {
	tests := []struct {
		name   string
		err    flowcontrol.Error
		status int
		reason string
	}{
		{"queue full", flowcontrol.Error{Outcome: flowcontrol.RejectedCapacity}, http.StatusTooManyRequests, eppwire.DroppedSaturated},
		{"full and no endpoints", flowcontrol.Error{Outcome: flowcontrol.RejectedNoEndpoints, PoolEmpty: true}, http.StatusServiceUnavailable, eppwire.DroppedNoEndpoints},
		{"evicted, no endpoints", flowcontrol.Error{Outcome: flowcontrol.EvictedNoEndpoints, PoolEmpty: true}, http.StatusServiceUnavailable, eppwire.DroppedNoEndpoints},
		{"TTL with endpoints", flowcontrol.Error{Outcome: flowcontrol.EvictedTTL}, http.StatusTooManyRequests, eppwire.DroppedTTLExpired},
		{"TTL on an empty pool", flowcontrol.Error{Outcome: flowcontrol.EvictedTTL, PoolEmpty: true}, http.StatusServiceUnavailable, eppwire.DroppedNoEndpoints},
		{"client gone", flowcontrol.Error{Outcome: flowcontrol.EvictedContextCancelled}, http.StatusServiceUnavailable, eppwire.DroppedContextCancelled},
		{"refused while stopping", flowcontrol.Error{Outcome: flowcontrol.RejectedOther, ShuttingDown: true}, http.StatusServiceUnavailable, eppwire.DroppedShuttingDown},
		{"evicted while stopping", flowcontrol.Error{Outcome: flowcontrol.EvictedOther, ShuttingDown: true}, http.StatusServiceUnavailable, eppwire.DroppedShuttingDown},
		{"other refusal", flowcontrol.Error{Outcome: flowcontrol.RejectedOther}, http.StatusInternalServerError, ""},
		{"other eviction", flowcontrol.Error{Outcome: flowcontrol.EvictedOther}, http.StatusInternalServerError, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := FlowError(&tc.err)
			if e.HTTPStatus() != tc.status || e.DroppedReason != tc.reason {
				t.Fatalf("%v: status %d, reason %q; want %d, %q", &tc.err, e.HTTPStatus(), e.DroppedReason, tc.status, tc.reason)
			}
		})
	}
}

// A request counts against maxBytes by its body's size, also when the
// picker sees only its headers (the wasm filter's fast path, where the
// proxy holds the body while the request waits).
func TestFlowRequestBytes(t *testing.T) {
	tests := []struct {
		name string
		req  server.Request
		want int64
	}{
		{"body read", server.Request{Body: make([]byte, 700)}, 700},
		{"headers only, length announced", server.Request{HeaderOnly: true, Headers: map[string]string{"content-length": "900"}}, 900},
		{"headers only, no length", server.Request{HeaderOnly: true, Headers: map[string]string{}}, 0},
		{"headers only, bad length", server.Request{HeaderOnly: true, Headers: map[string]string{"content-length": "-5"}}, 0},
	}
	d := New(Options{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sr := d.schedulingRequest(&tc.req)
			if got := FlowRequest(&tc.req, sr).Bytes; got != tc.want {
				t.Fatalf("Bytes = %d, want %d", got, tc.want)
			}
		})
	}
}

// trackingAdmission dispatches at once, as a tracked flow, and keeps the
// revoke func the director registers.
type trackingAdmission struct{ revoke func() }

func (a *trackingAdmission) Admit(_ context.Context, _ flowcontrol.Request, dispatch func(*flowcontrol.Item)) error {
	dispatch(new(flowcontrol.Item))
	return nil
}
func (a *trackingAdmission) Notify()                               {}
func (a *trackingAdmission) Track(_ *flowcontrol.Item, rev func()) { a.revoke = rev }
func (a *trackingAdmission) Finished(*flowcontrol.Item)            {}

// A tracked request's exchange is revocable: flow control's revoke closes
// the channel the server ends the stream on. Without flow control there
// is nothing to watch.
func TestExchangeRevocation(t *testing.T) {
	for _, tc := range []struct {
		name string
		adm  *trackingAdmission
	}{
		{name: "flow control", adm: &trackingAdmission{}},
		{name: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, _ := configuredOptions(t, "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: random-picker\n",
				pool{schedtest.Endpoint("a", endpoints.Metrics{})}, time.Now)
			if tc.adm != nil {
				opts.Admission = tc.adm
			}
			_, ex, err := New(opts).HandleRequest(context.Background(), completion("p", true))
			if err != nil {
				t.Fatal(err)
			}
			defer ex.ResponseDone(context.Background(), server.ResponseSummary{})
			revoked := ex.(server.Revocable).Revoked()
			if tc.adm == nil {
				if revoked != nil {
					t.Fatal("an exchange without flow control is revocable")
				}
				return
			}
			select {
			case <-revoked:
				t.Fatal("revoked before flow control revoked it")
			default:
			}
			tc.adm.revoke()
			select {
			case <-revoked:
			default:
				t.Fatal("flow control's revoke did not close Revoked")
			}
		})
	}
}
