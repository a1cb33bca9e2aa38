package dashboards

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/batch/async"
	"github.com/kvgate/kvgate/internal/testutil/redistest"
)

// asyncQueue is the async processor's queue in the dashboards' fleet.
const asyncQueue = "dashboards-batch"

// asyncPart is kvgate's async processor (batch/async, what `kvgate async`
// runs) draining a real redis-server's sorted set into the fleet's
// gateway.
type asyncPart struct {
	metrics string // host:port of its /metrics
	client  *async.Client
}

// startAsync starts redis-server and the processor, dispatching to f's
// gateway; both stop with the fleet and the test.
func startAsync(ctx context.Context, t *testing.T, f *fleet) *asyncPart {
	t.Helper()
	rs := redistest.Start(t)
	cfg, err := async.ParseConfig([]byte(fmt.Sprintf(`{"url":"redis://%s/0","poll_interval_ms":50,"queues":[{"queue_name":%q,"igw_base_url":%q}]}`,
		rs.Addr, asyncQueue, f.gatewayURL)), "")
	if err != nil {
		t.Fatal(err)
	}
	reg := promclient.NewRegistry()
	// Short back-offs, so that the sims' injected 500s are retried within
	// the load.
	p, err := async.New(async.Options{Config: cfg, Concurrency: 4, Registerer: reg,
		Backoff: async.Backoff{Base: 50 * time.Millisecond, Max: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	a := &asyncPart{metrics: serveMetrics(t, reg)}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	a.client = async.NewClient(rdb, async.ClientOptions{Queue: asyncQueue})
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("async processor: %v", err)
		}
		a.client.Close()
		rdb.Close()
	})
	return a
}

// asyncResult counts the async requests' outcomes.
type asyncResult struct {
	ok, failed, errs atomic.Int64
}

// load submits requests through the queue, workers at a time, every
// unknownEvery-th for a model no server has (a fatal 404), and waits for
// every result.
func (a *asyncPart) load(ctx context.Context, workers, requests, unknownEvery int) *asyncResult {
	res := &asyncResult{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > requests || ctx.Err() != nil {
					return
				}
				model := fleetModel
				if unknownEvery > 0 && i%unknownEvery == 0 {
					model = "no-such-model"
				}
				body := fmt.Sprintf(`{"model":%q,"prompt":"batch item %d: %s","max_tokens":4}`, model, i, systemPrompt[:200])
				rep, err := a.client.Do(ctx, async.Call{ID: fmt.Sprint("dash-", i), Body: []byte(body), Deadline: time.Now().Add(2 * time.Minute)})
				switch {
				case err != nil:
					res.errs.Add(1)
				case rep.StatusCode == 200:
					res.ok.Add(1)
				default:
					res.failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return res
}
