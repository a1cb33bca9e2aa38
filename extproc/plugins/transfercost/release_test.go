package transfercost_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/kvgate/kvgate/extproc/director"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/transfercost"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
)

// pullAfter is a PreRequest hook run after the configured ones: it prices
// a pull as p2p-source-producer's PreRequest does, wherever the
// configuration puts it, and keeps a weak pointer to the decider's
// snapshot, so that what keeps it alive afterwards is the director's
// exchange.
type pullAfter struct {
	scheduling.Named
	dec              *transfercost.Decider
	source, computer *endpoints.Endpoint
	pays             bool
	ttft             weak.Pointer[float64]
}

func (o *pullAfter) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Result) {
	if ttft := transfercost.TTFTsOf(o.dec, cs); len(ttft) > 0 {
		o.ttft = weak.Make(&ttft[0])
	}
	// 1000 tokens: 131 MB at 12 GB/s is 11 ms, recomputing them 63 ms.
	o.pays = o.dec.PullPays(cs, o.source, o.computer, 1000)
}

// TestSnapshotDroppedAtDecision: the decider's per-candidate snapshot is
// whole for every PreRequest hook of the decision, the last one included,
// and unreachable from a routed request's exchange while its response
// streams.
func TestSnapshotDroppedAtDecision(t *testing.T) {
	b := build(t, fleetConfig(true, ""), nil)
	eps := schedtest.Pool{
		schedtest.Endpoint("d1", endpoints.Metrics{}, endpoints.RoleLabel, "decode"),
		schedtest.Endpoint("d2", endpoints.Metrics{}, endpoints.RoleLabel, "decode"),
		schedtest.Endpoint("p", endpoints.Metrics{}, endpoints.RoleLabel, "prefill"),
	}
	last := &pullAfter{Named: scheduling.NewNamed("pull-after", "pull-after"), dec: decider(b), source: eps[0], computer: eps[1]}
	d := director.New(director.Options{Pool: eps, Scheduler: b.Scheduler, Now: time.Now, Hooks: director.Hooks{
		PreRequest: append(append([]scheduling.PreRequest(nil), b.PreRequest...), last), FirstToken: b.FirstToken, ResponseComplete: b.ResponseComplete, Hold: b.Hold}})
	ctx := context.Background()
	body := []byte(`{"model":"m","stream":true,"max_tokens":10,"prompt":"` + strings.Repeat("lorem ipsum ", 4096) + `"}`)
	parsed, err := openai.Parse(openai.Completions, body)
	if err != nil {
		t.Fatal(err)
	}
	req := &server.Request{ID: "r", Method: "POST", API: openai.Completions, Headers: map[string]string{}, Body: body, Parsed: parsed, ReceivedAt: time.Now()}
	dec, ex, err := d.HandleRequest(ctx, req)
	if err != nil || len(dec.Endpoints) == 0 {
		t.Fatalf("decision %v, %v", dec, err)
	}
	if last.ttft == (weak.Pointer[float64]{}) {
		t.Fatal("no snapshot in the last PreRequest hook")
	}
	if !last.pays {
		t.Error("the last PreRequest hook priced no pull: the snapshot was gone")
	}
	ex.ResponseStarted(ctx, server.ResponseHead{Status: 200})
	ex.ResponseChunk(ctx, []byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"))
	if !testutil.Collected(last.ttft) {
		t.Error("the decider's snapshot is reachable while the response streams")
	}
	ex.ResponseChunk(ctx, []byte("data: [DONE]\n\n"))
	ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Streaming: true, Complete: true})
}
