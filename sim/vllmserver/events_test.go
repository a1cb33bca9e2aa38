package vllmserver

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestKVEventsMatchVLLM is the acceptance test: the shared vector's prompt,
// sent as a completion to a server configured like `kvgate sim --model
// Qwen/Qwen3-0.6B --block-size 16 --hash-seed 42`, is published over real
// ZMQ with exactly the block hashes real vLLM published, in both encodings.
func TestKVEventsMatchVLLM(t *testing.T) {
	vec := testutil.LoadHashVector(t)
	for _, enc := range []kvwire.Encoding{kvwire.EncodingArray, kvwire.EncodingMap} {
		t.Run(enc.String(), func(t *testing.T) {
			o := testOptions(t)
			o.Model, o.BlockSize, o.HashSeed = vec.Model, vec.BlockSize, vec.Seed
			o.KVEventsEndpoint, o.KVEventsEncoding = "tcp://127.0.0.1:*", enc
			s := startServer(t, o)
			if want := "kv@" + strings.TrimPrefix(s.URL(), "http://") + "@" + vec.Model; s.Topic() != want {
				t.Fatalf("topic %q, want %q", s.Topic(), want)
			}
			msgs := subscribe(t, s)

			r := complete(t, s, "/v1/completions", map[string]any{"model": vec.Model, "prompt": vec.Prompt, "max_tokens": 1})
			if r.Usage.PromptTokens < len(vec.TokenIDs) {
				t.Fatalf("prompt_tokens %d < the vector's %d", r.Usage.PromptTokens, len(vec.TokenIDs))
			}
			for {
				for _, ev := range nextBatch(t, s, msgs).Events {
					st, ok := ev.(kvwire.BlockStored)
					if !ok || !slices.Equal(st.TokenIDs, vec.TokenIDs) {
						continue // warm-up traffic
					}
					if got := hashKeys(st.BlockHashes); !slices.Equal(got, vec.BlockHashes) {
						t.Fatalf("block hashes\n got %v\nwant %v", got, vec.BlockHashes)
					}
					if st.ParentBlockHash != nil || st.BlockSize != vec.BlockSize || st.Medium != vec.Medium ||
						st.LoRAName != "" || st.LoRAID != nil {
						t.Fatalf("event %s", describe(st))
					}
					return
				}
			}
		})
	}
}

// TestKVEventsEviction fills a small cache with distinct prompts: blocks
// are evicted and announced, and a cache reset is announced too.
func TestKVEventsEviction(t *testing.T) {
	o := testOptions(t)
	o.NumGPUBlocks, o.MaxModelLen = 48, 512
	o.KVEventsEndpoint = "tcp://127.0.0.1:*"
	o.KVEventsEncoding = kvwire.EncodingMap
	s := startServer(t, o)
	msgs := subscribe(t, s)

	// 10 prompts of 20 blocks cannot all stay in 48 blocks.
	for i := range 10 {
		prompt := make([]int, 320)
		for k := range prompt {
			prompt[k] = 1000*i + k
		}
		complete(t, s, "/v1/completions", map[string]any{"model": o.Model, "prompt": prompt, "max_tokens": 1})
	}
	// Events arrive in order, so a block of these prompts is announced
	// stored before it is announced removed. (Warm-up blocks, whose
	// events the subscription may have missed, are evicted too.)
	stored := make(map[uint64]bool)
	for evicted := false; !evicted; {
		for _, ev := range nextBatch(t, s, msgs).Events {
			switch e := ev.(type) {
			case kvwire.BlockStored:
				for _, k := range hashKeys(e.BlockHashes) {
					stored[k] = true
				}
			case kvwire.BlockRemoved:
				if e.Medium != kvwire.MediumGPU || len(e.BlockHashes) != 1 {
					t.Fatalf("event %s", describe(e))
				}
				evicted = evicted || stored[e.BlockHashes[0].Key()]
			}
		}
	}

	status, body := post(t, s.URL()+"/reset_prefix_cache", "")
	if status != 200 {
		t.Fatalf("reset_prefix_cache = %d %s", status, body)
	}
	for {
		b := nextBatch(t, s, msgs)
		if slices.ContainsFunc(b.Events, func(ev kvwire.Event) bool { return ev.Type() == kvwire.TypeAllBlocksCleared }) {
			return
		}
	}
}
