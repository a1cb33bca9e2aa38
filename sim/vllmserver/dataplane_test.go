package vllmserver

import (
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/agent/kvblock"
	"github.com/kvgate/kvgate/internal/kvhash"
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
