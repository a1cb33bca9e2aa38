package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/agent/netobs"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/testutil/proctest"
	"github.com/kvgate/kvgate/internal/vllm"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// bins returns kvgate and kvgate-agent: KVGATE_BIN_DIR's, or built here.
func bins(t *testing.T) (string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real processes; skipped with -short")
	}
	if bd := os.Getenv("KVGATE_BIN_DIR"); bd != "" {
		k, a := filepath.Join(bd, "kvgate"), filepath.Join(bd, "kvgate-agent")
		for _, p := range []string{k, a} {
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("KVGATE_BIN_DIR: %v", err)
			}
		}
		return k, a
	}
	root := testutil.RepoRoot(t)
	dir := t.TempDir()
	for _, b := range []string{"kvgate", "kvgate-agent"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b), "./cmd/"+b)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b, err, out)
		}
	}
	return filepath.Join(dir, "kvgate"), filepath.Join(dir, "kvgate-agent")
}

// start runs a process whose output is kept for failure reports, and
// returns once re finds an address in it.
func start(t *testing.T, re *regexp.Regexp, name string, args ...string) (*proctest.Proc, string) {
	t.Helper()
	return proctest.Start(t, re, []string{"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"}, name, args...)
}

var (
	agentRe = regexp.MustCompile(`listening on (\S+)`)
	simRe   = regexp.MustCompile(`kvgate sim listening.* addr=(\S+)`)
)

// startAgent runs an agent whose region directory is regionDir (its
// servers' --kv-region-dir).
func startAgent(t *testing.T, bin, regionDir string) (*proctest.Proc, string) {
	return start(t, agentRe, bin, "--listen", "127.0.0.1:0", "--cpu-bytes", strconv.Itoa(256*blockBytes),
		"--region-dir", regionDir, "--log-level", "debug")
}

const (
	bytesPerToken = 1024
	blockBytes    = 16 * bytesPerToken
)

func startSim(t *testing.T, bin, agent, regionDir, tok string, extra ...string) string {
	args := append([]string{"sim", "--host", "127.0.0.1", "--port", "0", "--tokenizer", tok,
		"--agent", agent, "--kv-bytes-per-token", strconv.Itoa(bytesPerToken), "--num-gpu-blocks", "64",
		"--kv-region-dir", regionDir, "--kv-transfer-timeout", "5s", "--log-level", "debug"}, extra...)
	_, addr := start(t, simRe, bin, args...)
	return "http://" + addr
}

type completion struct {
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		Details      struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KV *vllm.KVTransferParams `json:"kv_transfer_params"`
}

func post(t *testing.T, url string, body map[string]any) (int, completion, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var c completion
	_ = json.Unmarshal(raw, &c)
	return resp.StatusCode, c, string(raw)
}

// metric reads a counter from a sim's /metrics (0 when absent).
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	v, _ := lookupMetric(t, url, name)
	return v
}

// lookupMetric reads a series from a sim's /metrics; ok says it was there.
func lookupMetric(t *testing.T, url, name string) (v float64, ok bool) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v, true
		}
	}
	return 0, false
}

func waitMetric(t *testing.T, url, name string, atLeast float64) float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := metric(t, url, name)
		if v >= atLeast || time.Now().After(deadline) {
			return v
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDrained waits until the sim at url has done all the agent work its
// engine queued so far (kvgate_sim_kv_pending_work is 0).
func waitDrained(t *testing.T, url string) {
	t.Helper()
	testutil.WaitFor(t, url+"'s agent work done", func() bool {
		n, ok := lookupMetric(t, url, "kvgate_sim_kv_pending_work")
		if !ok {
			t.Fatalf("%s serves no kvgate_sim_kv_pending_work", url)
		}
		return n == 0
	})
}

// text is a prompt of distinct words (no shared prefix across seeds).
func text(seed, words int) string {
	var b strings.Builder
	for i := range words {
		fmt.Fprintf(&b, "w%d_%d ", seed, i)
	}
	return b.String()
}

func TestKVDataPlane(t *testing.T) {
	kvgate, agentBin := bins(t)
	tok := testutil.TokenizerDir(t)
	dirA, dirB := t.TempDir(), t.TempDir()
	agentA, addrA := startAgent(t, agentBin, dirA)
	_, addrB := startAgent(t, agentBin, dirB)
	prefill := startSim(t, kvgate, addrA, dirA, tok)
	decode := startSim(t, kvgate, addrB, dirB, tok)
	// A second decoder on agent B that recomputes when a pull fails.
	recompute := startSim(t, kvgate, addrB, dirB, tok, "--kv-load-failure-policy", "recompute")

	// P/D: the prefill leg, then the decode leg with its kv_transfer_params.
	prompt := text(1, 120)
	code, pre, raw := post(t, prefill, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	if code != 200 || pre.KV == nil || !pre.KV.DoRemotePrefill || len(pre.KV.RemoteBlockIDs) == 0 {
		t.Fatalf("prefill: %d %s", code, raw)
	}
	if got := *pre.KV.RemoteHost + ":" + strconv.Itoa(*pre.KV.RemotePort); got != addrA {
		t.Fatalf("remote_host:remote_port %s, want the prefiller's agent %s", got, addrA)
	}
	code, dec, raw := post(t, decode, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 4,
		"kv_transfer_params": pre.KV})
	if code != 200 {
		t.Fatalf("decode: %d %s", code, raw)
	}
	nb := len(pre.KV.RemoteBlockIDs)
	if dec.Usage.Details.CachedTokens < (nb-1)*16 {
		t.Fatalf("decode cached %d tokens, want the %d pulled blocks' (%s)", dec.Usage.Details.CachedTokens, nb, raw)
	}
	if b := metric(t, decode, "kvgate_sim_kv_pulled_bytes_total"); b != float64(nb*blockBytes) {
		t.Fatalf("decode pulled %v bytes, want %d", b, nb*blockBytes)
	}
	if v := metric(t, decode, "kvgate_sim_kv_verify_failures_total"); v != 0 {
		t.Fatalf("%v blocks failed verification", v)
	}
	// vLLM's NixlConnector series, as the llm-d dashboards read them.
	if n, b, d := metric(t, decode, "vllm:nixl_xfer_time_seconds_count"), metric(t, decode, "vllm:nixl_bytes_transferred_sum"),
		metric(t, decode, "vllm:nixl_num_descriptors_sum"); n != 1 || b != float64(nb*blockBytes) || d != float64(nb) {
		t.Fatalf("vllm:nixl_* transfers %v, bytes %v, descriptors %v; want 1, %d, %d", n, b, d, nb*blockBytes, nb)
	}
	// The decoder's agent reports the READ in its telemetry stream: the
	// path from the prefiller's agent, as the picker reads it.
	peers := watchPeers(t, addrB)
	if len(peers) != 1 || peers[0].Address != "127.0.0.1" || peers[0].Class != netobs.NIXLClass || peers[0].BytesAcked != uint64(nb*blockBytes) ||
		peers[0].SrttUs == 0 || peers[0].ThroughputBytesPerSec <= 0 {
		t.Fatalf("decoder agent's telemetry peers %v, want the %d-byte READ from 127.0.0.1", peers, nb*blockBytes)
	}
	// The READ's notification freed the prefiller's hold.
	if v := waitMetric(t, prefill, "kvgate_sim_kv_released_total", 1); v < 1 {
		t.Fatal("the prefiller's blocks were not released by the decoder's notification")
	}

	// CPU tier: a prompt served on the decoder, pushed out of its 64 GPU
	// blocks by others, comes back from the agent's CPU tier.
	hot := text(2, 40)
	if code, _, raw := post(t, decode, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": hot, "max_tokens": 1}); code != 200 {
		t.Fatalf("hot prompt: %d %s", code, raw)
	}
	for i := range 6 {
		if code, _, raw := post(t, decode, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": text(10+i, 40), "max_tokens": 1}); code != 200 {
			t.Fatalf("filler %d: %d %s", i, code, raw)
		}
	}
	// Offloads run behind the engine: the fillers' evictions were queued
	// before their answers came, so once the queue is empty the hot
	// prompt's blocks are in the CPU tier.
	waitDrained(t, decode)
	if v := metric(t, decode, "kvgate_sim_kv_offloaded_blocks_total"); v < 8 {
		t.Fatalf("only %v blocks offloaded to the CPU tier", v)
	}
	code, again, raw := post(t, decode, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": hot, "max_tokens": 1})
	if code != 200 {
		t.Fatalf("hot again: %d %s", code, raw)
	}
	if metric(t, decode, "kvgate_sim_kv_cpu_hits_total") < 1 || again.Usage.Details.CachedTokens == 0 {
		t.Fatalf("no CPU-tier hit: cached %d (%s)", again.Usage.Details.CachedTokens, raw)
	}

	// P2P: the prefiller pulls the hot prompt's blocks from the decoder
	// agent's CPU tier (remote_kv_source, as llm-d's sidecar injects it).
	portB, _ := strconv.Atoi(addrB[strings.LastIndexByte(addrB, ':')+1:])
	code, p2p, raw := post(t, prefill, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": hot, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"remote_kv_source": map[string]any{"kv_request_id": "x", "remote_host": "127.0.0.1", "remote_port": portB}}})
	if code != 200 {
		t.Fatalf("p2p: %d %s", code, raw)
	}
	if n := metric(t, prefill, "kvgate_sim_kv_p2p_blocks_total"); n < 1 || p2p.Usage.Details.CachedTokens < int(n)*16 {
		t.Fatalf("P2P pulled %v blocks, cached %d (%s)", n, p2p.Usage.Details.CachedTokens, raw)
	}

	// A prefiller whose agent dies: the decode leg fails in bounded time
	// (kv_load_failure_policy=fail), it does not hang.
	prompt = text(3, 120)
	code, pre, raw = post(t, prefill, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	if code != 200 || pre.KV == nil {
		t.Fatalf("prefill 2: %d %s", code, raw)
	}
	_ = agentA.Cmd.Process.Kill()
	started := time.Now()
	code, _, raw = post(t, decode, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 4, "kv_transfer_params": pre.KV})
	if code != http.StatusInternalServerError || !strings.Contains(raw, "KV load failed") {
		t.Fatalf("decode from a dead prefiller agent: %d %s", code, raw)
	}
	t.Logf("dead prefiller agent: failed after %v: %s", time.Since(started).Round(time.Millisecond), raw)
	if v := metric(t, decode, "vllm:nixl_num_failed_transfers_total"); v != 1 {
		t.Fatalf("vllm:nixl_num_failed_transfers_total %v, want 1", v)
	}
	code, rec, raw := post(t, recompute, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prompt, "max_tokens": 4, "kv_transfer_params": pre.KV})
	if code != 200 || rec.Usage.Details.CachedTokens != 0 {
		t.Fatalf("recompute policy: %d %s", code, raw)
	}
	if v := metric(t, recompute, "kvgate_sim_kv_recomputed_total"); v != 1 {
		t.Fatalf("recomputed %v requests, want 1", v)
	}
}

// watchPeers reads one telemetry report from the agent at addr.
func watchPeers(t *testing.T, addr string) []*telemetryv1.Peer {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	w, err := telemetryv1.NewTelemetryClient(conn).Watch(ctx, &telemetryv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return r.Peers
}

// The main kvgate binary stays pure Go: only kvgate-agent links UCX.
func TestMainBinaryWithoutCgoPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	cmd := exec.Command("go", "list", "-deps", "./cmd/kvgate")
	cmd.Dir = testutil.RepoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "github.com/kvgate/kvgate/nixl-cgo" || p == "github.com/kvgate/kvgate/agent" {
			t.Fatalf("cmd/kvgate depends on %s (cgo)", p)
		}
	}
}
