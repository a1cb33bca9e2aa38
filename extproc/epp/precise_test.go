package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/testutil"
)

// The picker learns from vLLM KV events, over real ZMQ, that endpoint B
// holds the test vector prompt's blocks, and routes that prompt to B though
// B is slightly busier; BlockRemoved and AllBlocksCleared take it away again.
func TestPreciseRoutingFromKVEvents(t *testing.T) {
	v := testutil.LoadHashVector(t)
	tokDir := testutil.TokenizerDir(t)
	for _, enc := range []kvwire.Encoding{kvwire.EncodingArray, kvwire.EncodingMap} {
		t.Run(enc.String(), func(t *testing.T) {
			cfg := fmt.Sprintf(`apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters: {tokenizer: %q, blockSize: 16, hashSeed: "42"}
- type: queue-scorer
- type: kv-cache-utilization-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: precise-prefix-cache-scorer, weight: 3}
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
`, tokDir)
			f := startFleetWith(t, func(o *Options) {
				o.ConfigText = cfg
				o.KVEventsAddr = "tcp://127.0.0.1:0"
			}, vllmMetrics(0, 0.1, ""), vllmMetrics(1, 0.2, ""))
			a, b := f.servers[0].addr, f.servers[1].addr
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			pub, err := kvwire.NewPublisher(ctx, kvwire.PublisherConfig{
				Endpoint: "tcp://" + f.picker.KVEventsAddr().String(),
				Topic:    kvwire.BuildTopic(b, v.Model),
				Encoding: enc,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })

			body, _ := json.Marshal(map[string]any{"model": v.Model, "prompt": v.Prompt, "max_tokens": 1})
			routeWhile := func(what string, publish kvwire.Event, want string) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for {
					// Re-publishing covers the slow-joiner loss of the first
					// messages after connecting. Each repeated BlockStored
					// adds a copy of the blocks, and the BlockRemoved below
					// is repeated until the last copy is gone.
					if err := pub.Publish(kvwire.EventBatch{TS: 1, Events: []kvwire.Event{publish}}); err != nil {
						t.Fatal(err)
					}
					_, r := f.route(t, nil, string(body), 3)
					if f.destination(t, r) == want {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: still not routed to %s", what, want)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			if _, r := f.route(t, nil, string(body), 1); f.destination(t, r) != a {
				t.Fatal("without KV events the less loaded A must win")
			}
			hashes := make([]kvwire.Hash, len(v.BlockHashes))
			for i, h := range v.BlockHashes {
				hashes[i] = kvwire.Uint64Hash(h)
			}
			stored := kvwire.BlockStored{BlockHashes: hashes, TokenIDs: v.TokenIDs, BlockSize: v.BlockSize, Medium: kvwire.MediumGPU}
			routeWhile("BlockStored on B", stored, b)
			routeWhile("BlockRemoved on B", kvwire.BlockRemoved{BlockHashes: hashes[:1], Medium: kvwire.MediumGPU}, a)
			routeWhile("BlockStored on B again", stored, b)
			routeWhile("AllBlocksCleared on B", kvwire.AllBlocksCleared{}, a)
		})
	}
}
