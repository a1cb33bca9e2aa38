package inflightload

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"weak"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/testutil"
)

func build(t *testing.T) *Producer {
	t.Helper()
	p, err := schedtest.Build[*Producer](New, "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProduce(t *testing.T) {
	idle := schedtest.Endpoint("idle", endpoints.Metrics{})
	prefilling := schedtest.Endpoint("prefilling", endpoints.Metrics{})
	prefilling.Charge(300, 700, 1500, 1500)
	decoding := schedtest.Endpoint("decoding", endpoints.Metrics{})
	c := decoding.Charge(0, 50, 400, 400)
	c.FirstToken()
	scraped := schedtest.Endpoint("scraped", endpoints.Metrics{WaitingQueueSize: 3, RunningRequests: 2})

	eps := []*endpoints.Endpoint{idle, prefilling, decoding, scraped}
	want := []endpoints.Load{
		{},
		{PrefillRequests: 1, PrefillTokens: 700, PrefillAttention: endpoints.AttentionPairs(300, 700)},
		{DecodeRequests: 1, DecodeTokens: 400},
		{ExternalWaiting: 3, ExternalRunning: 2},
	}
	cs := scheduling.NewCycleState()
	build(t).Produce(context.Background(), cs, &scheduling.Request{}, eps)
	got, ok := scheduling.Read(cs, Key)
	if !ok {
		t.Fatal("no snapshot in the cycle state")
	}
	// Consumers index the snapshot by their own candidate index, which
	// only holds for the very slice they were handed.
	if len(got.Candidates) != len(eps) || &got.Candidates[0] != &eps[0] {
		t.Fatal("snapshot is not over the candidate slice")
	}
	if !slices.Equal(got.Loads, want) {
		t.Fatalf("loads %+v, want %+v", got.Loads, want)
	}

	// The request's later plugins must see the numbers of the decision
	// even as other requests come and go.
	idle.Charge(0, 1000, 1000, 1000)
	c.Release()
	scraped.SetMetrics(&endpoints.Metrics{})
	if !slices.Equal(got.Loads, want) {
		t.Fatalf("snapshot changed with the live load: %+v", got.Loads)
	}
	if idle.Load().PrefillRequests != 1 || decoding.Load().DecodeRequests != 0 || scraped.Load().ExternalWaiting != 0 {
		t.Fatal("the live load did not change; the check above proves nothing")
	}

	// A later request gets its own snapshot.
	cs2 := scheduling.NewCycleState()
	build(t).Produce(context.Background(), cs2, &scheduling.Request{}, eps)
	if l, _ := scheduling.Read(cs2, Key); l.Loads[0].PrefillTokens != 1000 {
		t.Fatalf("second snapshot %+v", l.Loads[0])
	}
}

func TestProduceNoCandidates(t *testing.T) {
	cs := scheduling.NewCycleState()
	build(t).Produce(context.Background(), cs, &scheduling.Request{}, nil)
	if l, ok := scheduling.Read(cs, Key); !ok || len(l.Loads) != 0 {
		t.Fatalf("snapshot %+v, %v", l, ok)
	}
}

func TestParams(t *testing.T) {
	for _, good := range []string{"", "{}", "null"} {
		if _, err := schedtest.Build[*Producer](New, good); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
	for _, bad := range []string{`{"ttl": "1s"}`, `[]`, `3`} {
		if _, err := New("", []byte(bad), &scheduling.Handle{}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	p := build(t)
	if !slices.Equal(p.Produces(), []string{Key.String()}) || len(p.Consumes()) != 0 {
		t.Errorf("produces %v, consumes %v", p.Produces(), p.Consumes())
	}
	if _, err := scheduling.OrderProducers([]scheduling.DataProducer{p}); err != nil {
		t.Error(err)
	}
}

// TestDecisionDropsLoads: the snapshot is unreachable from the cycle state
// once the decision's hooks have run.
func TestDecisionDropsLoads(t *testing.T) {
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	p := build(t)
	cs := scheduling.NewCycleState()
	p.Produce(context.Background(), cs, &scheduling.Request{}, eps)
	l, _ := scheduling.Read(cs, Key)
	loads := weak.Make(&l.Loads[0])
	// As the director runs every plugin that has the hook.
	if h, ok := any(p).(scheduling.PreRequest); ok {
		h.PreRequest(context.Background(), cs, &scheduling.Request{}, &scheduling.Result{})
	}
	if !testutil.Collected(loads) {
		t.Error("the loads are reachable after the decision")
	}
	runtime.KeepAlive(cs)
}
