package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/batch/async"
	"github.com/kvgate/kvgate/benchmarks/workload"
)

func jobRequests(n int) []workload.Request {
	out := make([]workload.Request, n)
	for i := range out {
		out[i] = workload.Request{Segments: []workload.Segment{{Key: uint64(5000 + i), Len: 200}}, OutputTokens: 30, Objective: workload.ObjectiveBatch}
	}
	return out
}

// maxInFlight is the most job requests in flight at once.
func maxInFlight(res *Result, from int) int {
	type ev struct {
		at time.Duration
		d  int
	}
	var evs []ev
	for _, r := range res.Requests[from:] {
		if r.Err == "" {
			evs = append(evs, ev{r.Arrival, 1}, ev{r.Arrival + r.E2E, -1})
		}
	}
	slices.SortFunc(evs, func(a, b ev) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.d - b.d
	})
	n, m := 0, 0
	for _, e := range evs {
		n += e.d
		m = max(m, n)
	}
	return m
}

func TestAsyncJob(t *testing.T) {
	limit := func(n string) async.GateConfig {
		return async.GateConfig{GateType: async.GateLocalMaxConcurrency, GateParams: map[string]any{"limit": n}}
	}
	for _, tc := range []struct {
		name   string
		policy Policy
		online []workload.Request
		gate   async.GateConfig
		check  func(t *testing.T, res *Result)
	}{
		{"local-max-concurrency bounds the job", fcPolicy(""), nil, limit("3"), func(t *testing.T, res *Result) {
			if m := maxInFlight(res, 0); m > 3 {
				t.Errorf("%d job requests in flight, limit 3", m)
			}
		}},
		{"picker-saturation holds the job behind online traffic", fcPolicy(""), burst(8, 0, 0), async.GateConfig{GateType: async.GateComposite, GateParams: map[string]any{
			"gates": []any{map[string]any{"gate_type": "local-max-concurrency", "gate_params": map[string]any{"limit": 8}},
				map[string]any{"gate_type": "picker-saturation", "gate_params": map[string]any{"threshold": 0.5}}}}},
			func(t *testing.T, res *Result) {
				// Capacity is 4 (2 servers × 2): the gate opens below
				// saturation 0.5, so no job request arrives while two online
				// requests are in flight.
				for _, j := range res.Requests[8:] {
					n := 0
					for _, r := range res.Requests[:8] {
						if r.Err != "" {
							t.Fatalf("online request failed: %s", r.Err)
						}
						if r.Arrival+r.Queued <= j.Arrival && r.Arrival+r.E2E > j.Arrival {
							n++
						}
					}
					if n >= 2 {
						t.Errorf("a job request arrived at %v with %d online requests in flight", j.Arrival, n)
					}
				}
				if res.Job.ClosedPolls == 0 {
					t.Error("no poll was held")
				}
			}},
		{"the flow-control band's 429s are retried", fcPolicy(""), nil, limit("40"), func(t *testing.T, res *Result) {
			if res.Job.Retries == 0 {
				t.Error("no retries with 40 in flight against a band of 20")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := smallOpts(t)
			opts.Replicas = 2
			opts.Objectives = map[string]int{workload.ObjectiveOnline: 100, workload.ObjectiveBatch: -1}
			const n = 60
			opts.Job = &AsyncJob{Requests: jobRequests(n), Start: 20 * time.Millisecond, Deadline: time.Hour, PollInterval: 20 * time.Millisecond, BatchSize: 10, Gate: tc.gate}
			res, err := Run(context.Background(), opts, tc.policy, tc.online)
			if err != nil {
				t.Fatal(err)
			}
			if res.Job == nil || res.Job.Completed != n || res.Job.Failed+res.Job.Expired != 0 {
				t.Fatalf("job %+v", res.Job)
			}
			if len(res.Requests) != len(tc.online)+n || res.Job.End <= 0 {
				t.Fatalf("%d results, end %v", len(res.Requests), res.Job.End)
			}
			for _, r := range res.Requests[len(tc.online):] {
				if r.Err != "" || r.Objective != workload.ObjectiveBatch || r.Priority != -1 {
					t.Fatalf("job request %+v", r)
				}
			}
			tc.check(t, res)
		})
	}
}

// A deadline the job cannot meet: what is left when it passes is dropped
// at dequeue, as the processor drops it.
func TestAsyncJobDeadline(t *testing.T) {
	opts := smallOpts(t)
	opts.Replicas = 1
	opts.Objectives = map[string]int{workload.ObjectiveBatch: -1}
	opts.Job = &AsyncJob{Requests: jobRequests(200), Deadline: time.Second, PollInterval: 100 * time.Millisecond, BatchSize: 1,
		Gate: async.GateConfig{GateType: async.GateLocalMaxConcurrency, GateParams: map[string]any{"limit": 1}}}
	res, err := Run(context.Background(), opts, fcPolicy(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if j := res.Job; j.Expired == 0 || j.Completed == 0 || j.Completed+j.Expired+j.Failed != 200 {
		t.Fatalf("job %+v", j)
	}
}
