package vllmserver

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// TestMainCommand runs `kvgate sim` from its command line, as the binary does,
// and stops it with its context.
func TestMainCommand(t *testing.T) {
	dir := testutil.TokenizerDir(t)
	var logs testutil.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, []string{"Qwen/Qwen3-0.6B", "--host", "127.0.0.1", "--port", "0", "--tokenizer", dir,
			"--served-model-name", "qwen", "qwen3", "--kv-events-endpoint", "tcp://127.0.0.1:*", "--time-scale", "50"}, io.Discard, &logs)
	}()
	addr := regexp.MustCompile(`sim listening" addr=(\S+)`)
	var m []string
	waitFor(t, "the listening log line", func() bool {
		m = addr.FindStringSubmatch(logs.String())
		return m != nil
	})
	resp, err := http.Get("http://" + m[1] + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/health: %v %v", resp, err)
	}
	resp.Body.Close()
	status, raw := post(t, "http://"+m[1]+"/v1/completions", `{"model":"qwen3","prompt":"hi","max_tokens":2}`)
	if status != http.StatusOK {
		t.Fatalf("completion: %d %s", status, raw)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Main: %v\n%s", err, logs.String())
	}
}
