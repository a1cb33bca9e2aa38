package workload

import (
	"testing"
	"time"
)

func TestMixed(t *testing.T) {
	chat := DefaultChat()
	chat.Stages = []Stage{{QPS: 2, Duration: 30 * time.Second}}
	tests := []struct {
		name          string
		m             Mixed
		online, batch bool
	}{
		{"both", Mixed{Online: chat, OnlineTimeout: time.Second, Batch: Batch{QPS: 5, PromptTokens: 100, OutputTokens: 50, Timeout: time.Minute}}, true, true},
		{"online alone", Mixed{Online: chat}, true, false},
		{"batch alone", Mixed{Online: Chat{Stages: []Stage{{QPS: 0, Duration: 30 * time.Second}}}, Batch: Batch{QPS: 5, PromptTokens: 100, OutputTokens: 50}}, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := tc.m.Generate(7)
			if err != nil {
				t.Fatal(err)
			}
			n := map[string]int{}
			for i, r := range reqs {
				n[r.Objective]++
				if i > 0 && r.Arrival < reqs[i-1].Arrival {
					t.Fatal("not in arrival order")
				}
				switch r.Objective {
				case ObjectiveOnline:
					if r.Timeout != tc.m.OnlineTimeout {
						t.Errorf("online timeout %v", r.Timeout)
					}
				case ObjectiveBatch:
					if r.Timeout != tc.m.Batch.Timeout || r.PromptLen() != 100 || r.OutputTokens != 50 || r.OfferedQPS != 0 || r.Arrival > 30*time.Second {
						t.Errorf("batch request %+v", r)
					}
				default:
					t.Errorf("objective %q", r.Objective)
				}
			}
			if (n[ObjectiveOnline] > 0) != tc.online || (n[ObjectiveBatch] > 0) != tc.batch {
				t.Errorf("classes %v", n)
			}
			// ~5 req/s for 30 s.
			if tc.batch && (n[ObjectiveBatch] < 100 || n[ObjectiveBatch] > 200) {
				t.Errorf("%d batch requests", n[ObjectiveBatch])
			}
		})
	}
	if _, err := (Mixed{Online: chat, Batch: Batch{QPS: 1}}).Generate(1); err == nil {
		t.Error("batch without tokens accepted")
	}
}
