package director

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
)

// A batch request that Envoy served from a fallback counts on the fallback
// for class-load-scorer from then on, as the rest of its live load does,
// and is released there: the next batch request goes to the primary, which
// runs none.
func TestFallbackMovesClassCount(t *testing.T) {
	a, b := schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})
	eps := pool{a, b}
	d := configuredDirector(t, `
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: class-load-scorer
  parameters: {apply: sheddable}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: class-load-scorer
  - pluginRef: max-score-picker
`, eps, time.Now)
	d.opts.Objectives = objectives{"batch": -1}
	ctx := context.Background()
	batch := func() (*endpoints.Endpoint, server.Exchange) {
		t.Helper()
		req := completion("a batch prompt", true)
		req.Objective = "batch"
		dec, ex, err := d.HandleRequest(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return eps.ByAddress(dec.Endpoints[0]), ex
	}
	primary, ex := batch()
	fallback := a
	if primary == a {
		fallback = b
	}
	if _, n := primary.InflightByClass(); n != 1 {
		t.Fatalf("after the decision the primary holds %d sheddable, want 1", n)
	}
	ex.ResponseStarted(ctx, server.ResponseHead{Status: 200, ServedEndpoint: fallback.Address()})
	if _, n := primary.InflightByClass(); n != 0 {
		t.Fatalf("the primary still holds %d sheddable after the fallback served", n)
	}
	if p, n := fallback.InflightByClass(); p != 0 || n != 1 {
		t.Fatalf("the fallback holds %d protected, %d sheddable; want 0, 1", p, n)
	}
	next, ex2 := batch()
	if next != primary {
		t.Fatalf("the next batch request went to %s, beside the one the fallback runs", next.Name())
	}
	ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true, ServedEndpoint: fallback.Address()})
	ex2.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true, ServedEndpoint: primary.Address()})
	for _, e := range eps {
		if p, n := e.InflightByClass(); p != 0 || n != 0 {
			t.Fatalf("%s holds %d, %d after the responses", e.Name(), p, n)
		}
	}
}
