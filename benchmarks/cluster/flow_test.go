package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
)

// fcPolicy is flow control over two classes: at most maxConcurrency
// requests per server, a 500ms TTL, a batch band of 20.
func fcPolicy(extra string) Policy {
	return Policy{Name: "fc", Config: []byte(`apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 2}
flowControl:
  defaultRequestTTL: 500ms
  saturationDetector: {pluginRef: concurrency-detector}
  priorityBands:
  - priority: -1
    maxRequests: 20
` + extra)}
}

// burst is online and batch requests arriving together: more than the
// fleet takes at once.
func burst(online, batch int, timeout time.Duration) []workload.Request {
	var out []workload.Request
	for i := range batch {
		out = append(out, workload.Request{Segments: []workload.Segment{{Key: uint64(1000 + i), Len: 300}}, OutputTokens: 50, Objective: workload.ObjectiveBatch})
	}
	for i := range online {
		out = append(out, workload.Request{Arrival: 10 * time.Millisecond, Segments: []workload.Segment{{Key: uint64(i), Len: 100}}, OutputTokens: 20,
			Objective: workload.ObjectiveOnline, Timeout: timeout})
	}
	return out
}

func TestFlowControlInTheSimulation(t *testing.T) {
	tests := []struct {
		name   string
		policy Policy
		reqs   []workload.Request
		check  func(t *testing.T, res *Result, by map[string]int)
	}{
		{"online jumps the batch queue", fcPolicy(""), burst(4, 12, 0), func(t *testing.T, res *Result, by map[string]int) {
			if by["online/served"] != 4 {
				t.Errorf("online served %d of 4: %v", by["online/served"], by)
			}
			// Every online request dispatched before the batch requests
			// queued ahead of it.
			var lastOnline, firstQueuedBatch time.Duration = 0, -1
			for _, r := range res.Requests {
				d := r.Arrival + r.Queued
				switch {
				case r.Objective == workload.ObjectiveOnline:
					lastOnline = max(lastOnline, d)
				case r.Queued > 0 && r.Err == "" && (firstQueuedBatch < 0 || d < firstQueuedBatch):
					firstQueuedBatch = d
				}
			}
			if firstQueuedBatch >= 0 && firstQueuedBatch < lastOnline {
				t.Errorf("a queued batch request dispatched at %v, before the last online one at %v", firstQueuedBatch, lastOnline)
			}
		}},
		{"full band is rejected", fcPolicy(""), burst(0, 40, 0), func(t *testing.T, res *Result, by map[string]int) {
			if by["batch/"+flowcontrol.RejectedCapacity.String()] == 0 {
				t.Errorf("no capacity rejections: %v", by)
			}
		}},
		{"TTL expires on time", fcPolicy(""), burst(0, 24, 0), func(t *testing.T, res *Result, by map[string]int) {
			if by["batch/"+flowcontrol.EvictedTTL.String()] == 0 {
				t.Fatalf("nothing expired: %v", by)
			}
			for _, r := range res.Requests {
				if r.Outcome == flowcontrol.EvictedTTL.String() && r.LeftLate != 0 {
					t.Errorf("left %v after its TTL", r.LeftLate)
				}
			}
		}},
		{"client cancellation leaves at once", fcPolicy(""), burst(30, 12, 50*time.Millisecond), func(t *testing.T, res *Result, by map[string]int) {
			if by["online/"+flowcontrol.EvictedContextCancelled.String()] == 0 {
				t.Fatalf("nothing cancelled: %v", by)
			}
			for _, r := range res.Requests {
				if r.Outcome == flowcontrol.EvictedContextCancelled.String() && r.LeftLate != 0 {
					t.Errorf("left %v after its client gave up", r.LeftLate)
				}
			}
		}},
		{"eviction revokes running batch", fcPolicy("  enableEviction: true\n"), burst(4, 8, 0), func(t *testing.T, res *Result, by map[string]int) {
			if by["batch/"+RevokedOutcome] == 0 || by["online/served"] != 4 {
				t.Errorf("outcomes %v", by)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := smallOpts(t)
			opts.Replicas = 2
			opts.Objectives = map[string]int{workload.ObjectiveOnline: 100, workload.ObjectiveBatch: -1}
			res, err := Run(context.Background(), opts, tc.policy, tc.reqs)
			if err != nil {
				t.Fatal(err)
			}
			by := map[string]int{}
			for _, r := range res.Requests {
				if r.Err == "" {
					by[r.Objective+"/served"]++
				} else {
					by[r.Objective+"/"+r.Outcome]++
				}
			}
			tc.check(t, res, by)
		})
	}
}
