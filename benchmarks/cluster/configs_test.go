package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/benchmarks/workload"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestFlowControlConfigs runs every EndpointPickerConfig that
// benchmarks/RESULTS.md measures the mixed workload with: each must load,
// put flow control in the path (except the no-flow-control references of a
// placement, *-nofc.yaml, which must not) and serve online traffic beside a
// batch burst.
func TestFlowControlConfigs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testutil.RepoRoot(t), "benchmarks", "flowcontrol", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no configs: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			opts := smallOpts(t)
			opts.Replicas = 2
			opts.Objectives = map[string]int{workload.ObjectiveOnline: 100, workload.ObjectiveBatch: -1}
			reqs := burst(6, 30, 0)
			s, err := newSim(opts, Policy{Name: filepath.Base(f), Config: data}, reqs)
			if err != nil {
				t.Fatal(err)
			}
			if ref := strings.HasSuffix(f, "-nofc.yaml"); (s.flow == nil) != ref {
				t.Fatalf("flow control in the path: %v; a -nofc.yaml reference: %v", s.flow != nil, ref)
			}
			res, err := s.run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res.Requests {
				if r.Objective == workload.ObjectiveOnline && r.Err != "" {
					t.Errorf("online request failed: %s", r.Err)
				}
			}
		})
	}
}
