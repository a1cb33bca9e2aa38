package director

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/metrics"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
)

// endedContexts counts the ResponseComplete calls whose context was
// already done: the exchange's end runs its hooks as the server's
// ResponseDone does, on a context that is not cancelled with the stream.
type endedContexts struct {
	scheduling.Named
	cancelled int
}

func (e *endedContexts) ResponseComplete(ctx context.Context, _ *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Response) {
	if ctx.Err() != nil {
		e.cancelled++
	}
}

// A Holder keeps a routed request in HandleRequest: prefill-join-hold
// lets the second long prompt on an endpoint go at the first one's first
// token, and a client that goes away while held ends its exchange, so its
// load and its place are released.
func TestHandleRequestWaitsForHold(t *testing.T) {
	a := schedtest.Endpoint("a", endpoints.Metrics{})
	d := configuredDirector(t, "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: prefill-join-hold\n  parameters: {minTokens: 1}\n- type: random-picker\n", pool{a}, time.Now)
	reg := prometheus.NewPedanticRegistry()
	d.metrics = metrics.New(reg)
	ended := &endedContexts{Named: scheduling.NewNamed("ended-contexts", "")}
	d.opts.Hooks.ResponseComplete = append(d.opts.Hooks.ResponseComplete, ended)
	ctx := context.Background()
	_, first, err := d.HandleRequest(ctx, completion("the first long prompt", true))
	if err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		ex  server.Exchange
		err error
	}
	route := func(ctx context.Context) chan outcome {
		done := make(chan outcome, 1)
		go func() {
			_, ex, err := d.HandleRequest(ctx, completion("the second long prompt", true))
			done <- outcome{ex, err}
		}()
		return done
	}
	second := route(ctx)
	select {
	case o := <-second:
		t.Fatalf("the second prompt went while the first was in prefill: %v", o.err)
	case <-time.After(50 * time.Millisecond):
	}
	first.ResponseStarted(ctx, server.ResponseHead{Status: 200})
	first.ResponseChunk(ctx, []byte("data: {}\n\n"))
	o := <-second
	if o.err != nil {
		t.Fatal(o.err)
	}

	cctx, cancel := context.WithCancel(ctx)
	third := route(cctx)
	for a.InflightRequests() != 3 { // charged at the decision, then held
		time.Sleep(time.Millisecond)
	}
	cancel()
	if o := <-third; !errors.Is(o.err, context.Canceled) || o.ex != nil {
		t.Fatalf("held request cancelled: %v, %v; want context.Canceled and no exchange", o.ex, o.err)
	}
	if n := a.InflightRequests(); n != 2 {
		t.Fatalf("%d in flight after the held request was cancelled, want 2", n)
	}
	if ended.cancelled != 0 {
		t.Fatal("the held request's ResponseComplete hooks ran with the stream's cancelled context")
	}
	o.ex.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true})
	first.ResponseDone(ctx, server.ResponseSummary{Status: 200, Complete: true})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() == "kvgate_prefill_join_hold_seconds" {
			for _, m := range mf.GetMetric() {
				held[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	if held[metrics.HoldReleased] != 1 || held[metrics.HoldCancelled] != 1 || len(held) != 2 {
		t.Fatalf("kvgate_prefill_join_hold_seconds counts %v, want one released and one cancelled", held)
	}
}
