package agent

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// TestMainWithoutEBPF: when the eBPF program cannot attach (here: a cgroup
// that does not exist; without root: permissions), the agent says so once,
// keeps serving, and its /metrics shows it runs without.
func TestMainWithoutEBPF(t *testing.T) {
	stdout, stderr := &testutil.SyncBuffer{}, &testutil.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, []string{"--listen", "127.0.0.1:0", "--cpu-bytes", "0", "--metrics-addr", "127.0.0.1:0",
			"--netobs", "--netobs-cgroup", t.TempDir() + "/no-such-cgroup"}, stdout, stderr)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	body := getMetrics(t, waitLine(t, stdout, regexp.MustCompile(`metrics on (\S+)`)))
	if !strings.Contains(body, "kvgate_netobs_bpf_attached 0") {
		t.Fatalf("metrics do not say eBPF is off:\n%s", body)
	}
	if n := strings.Count(stderr.String(), "running without eBPF network tracking"); n != 1 {
		t.Fatalf("said %d times, want once:\n%s", n, stderr.String())
	}
}
