package director

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
)

func TestDestination(t *testing.T) {
	for _, tc := range []struct {
		addr string
		port int
		want string
	}{
		{"10.0.0.7:8001", 0, "10.0.0.7:8001"},
		{"10.0.0.7:8001", 8000, "10.0.0.7:8000"},
		{"[fd00::7]:8001", 8000, "[fd00::7]:8000"},
		{"no-port", 8000, "no-port"},
	} {
		if got := destination(tc.addr, tc.port); got != tc.want {
			t.Errorf("destination(%q, %d) = %q, want %q", tc.addr, tc.port, got, tc.want)
		}
	}
}

// llm-d's data-parallel setup: a pod's ranks are endpoints on ports 8000
// (rank 0, also the pod's primary port) and 8001. A request for rank 1 is
// sent to port 8000 with the rank in x-data-parallel-host-port, and the
// proxy's report of serving it on 8000 does not move its load to rank 0;
// the rollout screener stamps the rank's labels on the response.
func TestDataParallelDestination(t *testing.T) {
	built := buildConfig(t, `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
- type: data-parallel-profile-handler
  parameters: {primaryPort: 8000}
- type: disaggregatedset-rollout-screener
  parameters:
    scope: {labelSelector: "set=s"}
    headerSelectors:
    - {name: slice, headerName: x-disagg-slice, labelKey: slice, mode: prefer}
    revisionGating: {mode: disabled}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
`, &scheduling.Handle{Services: map[string]any{}})
	rank := func(port, waiting int, slice string) *endpoints.Endpoint {
		e := endpoints.NewEndpoint(endpoints.Spec{Name: "pod", Address: "10.0.0.7:" + strconv.Itoa(port), Labels: map[string]string{"set": "s", "slice": slice}})
		e.SetMetrics(&endpoints.Metrics{WaitingQueueSize: waiting})
		return e
	}
	rank0, rank1 := rank(8000, 5, "0"), rank(8001, 0, "1")
	d := New(Options{Pool: pool{rank0, rank1}, Scheduler: built.Scheduler, Now: time.Now,
		Hooks: Hooks{PreRequest: built.PreRequest, ResponseHeader: built.ResponseHeader}})
	ctx := context.Background()
	dec, ex, err := d.HandleRequest(ctx, completion("a prompt", false))
	if err != nil {
		t.Fatal(err)
	}
	if len(dec.Endpoints) != 1 || dec.Endpoints[0] != "10.0.0.7:8000" {
		t.Fatalf("destination %v, want the pod's primary port", dec.Endpoints)
	}
	if got := dec.Headers[eppwire.HeaderDataParallel]; got != rank1.Address() {
		t.Fatalf("%s = %q, want rank 1", eppwire.HeaderDataParallel, got)
	}
	if rank1.InflightRequests() != 1 || rank0.InflightRequests() != 0 {
		t.Fatalf("in flight: rank 0 %d, rank 1 %d", rank0.InflightRequests(), rank1.InflightRequests())
	}
	ex.ResponseStarted(ctx, server.ResponseHead{Status: 200, ServedEndpoint: "10.0.0.7:8000"})
	if rank1.InflightRequests() != 1 || rank0.InflightRequests() != 0 {
		t.Fatalf("after the served report: rank 0 %d, rank 1 %d", rank0.InflightRequests(), rank1.InflightRequests())
	}
	if got := ex.(*exchange).ResponseHeaders(ctx, server.ResponseHead{Status: 200}); got["x-disagg-slice"] != "1" {
		t.Fatalf("response headers %v, want rank 1's slice", got)
	}
	ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true, ServedEndpoint: "10.0.0.7:8000"})
	if rank1.InflightRequests() != 0 || rank0.InflightRequests() != 0 {
		t.Fatal("load not released")
	}
}

// Under llm-d's data-parallel handler the proxy reports the pod's primary
// port it connected to, never the rank: a report naming another pod's
// primary port (a fallback; its sidecar knows no rank by the header's
// address and refuses it) says nothing of which rank served, and must not
// move the load to that pod's rank 0, nor one that spells the primary
// pod's address differently to the primary's rank 0.
func TestDataParallelServedElsewhereKeepsTheRank(t *testing.T) {
	built := buildConfig(t, `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
- type: data-parallel-profile-handler
  parameters: {primaryPort: 8000}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
`, &scheduling.Handle{Services: map[string]any{}})
	for _, served := range []string{"10.0.0.8:8000", "[::ffff:10.0.0.7]:8000"} {
		t.Run(served, func(t *testing.T) {
			// The datastore, whose lookup reads any spelling of an address.
			ds := endpoints.NewDatastore()
			addrs := []string{"10.0.0.7:8000", "10.0.0.7:8001", "10.0.0.8:8000", "10.0.0.8:8001"}
			specs := make([]endpoints.Spec, len(addrs))
			for i, a := range addrs {
				specs[i] = endpoints.Spec{Name: "rank-" + strconv.Itoa(i), Address: a}
			}
			if err := ds.Replace(specs); err != nil {
				t.Fatal(err)
			}
			for _, e := range ds.All() {
				waiting := 5
				if e.Address() == "10.0.0.7:8001" {
					waiting = 0 // the rank the queue scorer picks
				}
				e.SetMetrics(&endpoints.Metrics{WaitingQueueSize: waiting})
			}
			picked := ds.ByAddress("10.0.0.7:8001")
			d := New(Options{Pool: ds, Scheduler: built.Scheduler, Now: time.Now, Hooks: Hooks{PreRequest: built.PreRequest}})
			ctx := context.Background()
			_, ex, err := d.HandleRequest(ctx, completion("a prompt", false))
			if err != nil {
				t.Fatal(err)
			}
			ex.ResponseStarted(ctx, server.ResponseHead{Status: 200, ServedEndpoint: served})
			if picked.InflightRequests() != 1 {
				t.Fatalf("the picked rank lost its load to the report of %s", served)
			}
			for _, o := range ds.All() {
				if o != picked && o.InflightRequests() != 0 {
					t.Fatalf("%s charged on the report of %s", o.Address(), served)
				}
			}
			ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true, ServedEndpoint: served})
			if picked.InflightRequests() != 0 {
				t.Fatal("load not released")
			}
		})
	}
}
