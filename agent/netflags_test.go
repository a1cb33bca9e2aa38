package agent

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

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
	re := regexp.MustCompile(`metrics on (\S+)`)
	var addr string
	for deadline := time.Now().Add(20 * time.Second); addr == ""; {
		if m := re.FindStringSubmatch(stdout.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no metrics address; stdout %q stderr %q", stdout.String(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "kvgate_netobs_bpf_attached 0") {
		t.Fatalf("metrics do not say eBPF is off:\n%s", body)
	}
	if n := strings.Count(stderr.String(), "running without eBPF network tracking"); n != 1 {
		t.Fatalf("said %d times, want once:\n%s", n, stderr.String())
	}
}
