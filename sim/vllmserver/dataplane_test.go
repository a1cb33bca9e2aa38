package vllmserver

import (
	"context"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/agent"
	"github.com/kvgate/kvgate/agent/kvblock"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestPromptHashesConcurrent: a server hashes prompts for many requests at
// once (prefill legs naming their blocks, decode legs checking pulled
// ones) through the server's one hasher; each must get exactly the hashes
// a lone hasher gives. A hasher that reused an encoding buffer, shared
// between request goroutines, mixed one request's block encoding into
// another's: a prefill leg then announced, or a decode leg expected,
// a hash no engine computes from that block on, and kvgate up --pd under
// load lost 1 in 50 pulls to the byte check though the bytes moved intact.
func TestPromptHashesConcurrent(t *testing.T) {
	o := DefaultOptions()
	o.Agent = "127.0.0.1:1" // never dialled: only hashing runs
	s := &Server{opts: o, log: slog.New(slog.DiscardHandler), engID: "test"}
	s.engCfg.BlockSize = o.BlockSize
	d, err := newDataPlane(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer d.conn.Close()
	const (
		prompts = 8
		rounds  = 40
	)
	jobs := make([]*job, prompts)
	want := make([][]uint64, prompts)
	for p := range jobs {
		toks := make([]int, 192*o.BlockSize)
		for i := range toks {
			toks[i] = (i*31 + p*7919) % 151000
		}
		jobs[p] = &job{prompt: toks}
		h, err := kvhash.New(o.HashSeed, o.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		want[p] = h.AppendUint64s(nil, toks, kvhash.Extra{})
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wrong := 0
	for g := range 2 * prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := g % prompts
			for range rounds {
				if got := d.promptHashes(jobs[p], len(want[p])); !slices.Equal(got, want[p]) {
					mu.Lock()
					wrong++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if wrong > 0 {
		t.Fatalf("%d of %d concurrent prompt hashings differ from a lone hasher's", wrong, 2*prompts*rounds)
	}
}

// TestBlockContent: a failed byte check says what the slot held instead.
func TestBlockContent(t *testing.T) {
	hashes := []uint64{11, 22, 33}
	block := func(h uint64) []byte {
		b := make([]byte, 4096)
		kvblock.Fill(b, h)
		return b
	}
	other := make([]byte, 4096)
	for i := range other {
		other[i] = 0xab
	}
	other[7] = 0
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"zeros", make([]byte, 4096), "all zero"},
		{"misplaced", block(33), "holds block 2's content"},
		{"foreign", block(44), "holds the content of hash 44, no block of this request"},
		{"other", other, "1 zero bytes, no block's content"},
	} {
		if got := blockContent(tc.b, hashes); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// startAgent runs kvgate-agent from its command line in-process (UCX over
// loopback, region files in dir) until the test ends, and returns its
// address.
func startAgent(t *testing.T, dir string) string {
	t.Helper()
	if os.Getenv("UCX_NET_DEVICES") == "" {
		t.Setenv("UCX_NET_DEVICES", "lo")
	}
	var out testutil.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Main(ctx, []string{"--listen", "127.0.0.1:0", "--region-dir", dir, "--cpu-bytes", "0", "--log-level", "warn"}, &out, io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kvgate-agent: %v", err)
		}
	})
	listening := regexp.MustCompile(`listening on (\S+)`)
	var m []string
	waitFor(t, "kvgate-agent's listening line", func() bool {
		m = listening.FindStringSubmatch(out.String())
		return m != nil
	})
	return m[1]
}

// TestReleaseCount: a decode leg's pull tells the prefiller's agent how
// many notifications free the hold, and this decoder sends one. It sent
// the prefiller's tp_size, so a prefiller naming tp_size 2 (two
// tensor-parallel ranks, as vLLM's does) kept its blocks held until the
// lease expired, waiting for a second notification no one sends.
func TestReleaseCount(t *testing.T) {
	pdir, ddir := t.TempDir(), t.TempDir()
	po := testOptions(t)
	po.Role, po.Agent, po.KVRegionDir, po.KVBytesPerToken = RolePrefill, startAgent(t, pdir), pdir, 64
	po.HeldBlockTimeout = time.Hour // no lease expiry during the test: only notifications free holds
	prefiller := startServer(t, po)
	do := testOptions(t)
	do.Role, do.Agent, do.KVRegionDir, do.KVBytesPerToken = RoleDecode, startAgent(t, ddir), ddir, 64
	decoder := startServer(t, do)

	one, two := 1, 2
	for i, tc := range []struct {
		name string
		tp   *int // the tp_size the prefill leg's kv_transfer_params name
	}{
		{"no tp_size", nil},
		{"tp_size 1", &one},
		{"tp_size 2", &two},
	} {
		prompt := make([]int, 80)
		for k := range prompt {
			prompt[k] = 11*k + 1000*i
		}
		pre := complete(t, prefiller, "/v1/completions", map[string]any{"model": po.Model, "prompt": prompt, "max_tokens": 1,
			"kv_transfer_params": map[string]any{"do_remote_decode": true}})
		kv := pre.KVTransferParams
		if kv == nil || len(kv.RemoteBlockIDs) == 0 {
			t.Fatalf("%s: prefill kv_transfer_params %+v", tc.name, kv)
		}
		kv.TPSize = tc.tp
		dec := complete(t, decoder, "/v1/completions", map[string]any{"model": do.Model, "prompt": prompt, "max_tokens": 2,
			"kv_transfer_params": kv})
		if dec.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Fatalf("%s: decode usage %+v, want the pulled KV cached", tc.name, dec.Usage)
		}
		waitFor(t, tc.name+": the prefiller's agent to release the hold after the decoder's one notification", func() bool {
			return prefiller.DataPlaneStats().Released == uint64(i+1) && prefiller.Engine().Metrics().HeldRequests == 0
		})
	}
}
