package config

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/internal/openai"
)

// BenchmarkPick measures one scheduling decision with the default profile
// (queue 2, kv-cache 2, prefix 3, max-score) and its PreRequest hook, over
// fleets of several sizes, with ~2 KB prompts drawn from 32 shared system
// prompts so that the prefix index is warm and matches. It reports p50 and
// p99 per decision besides the mean.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{8, 64, 256, 1024} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			c, err := Parse(nil)
			if err != nil {
				b.Fatal(err)
			}
			built, err := Build(c, all.Registry(), &scheduling.Handle{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(7, 7))
			eps := make([]*endpoints.Endpoint, n)
			for i := range eps {
				eps[i] = schedtest.Endpoint(fmt.Sprintf("pod-%04d", i), endpoints.Metrics{
					WaitingQueueSize: rng.IntN(20), KVCacheUsage: rng.Float64(), UpdateTime: time.Now(),
				})
			}
			reqs := make([]*scheduling.Request, 256)
			for i := range reqs {
				system := strings.Repeat(fmt.Sprintf("system prompt %02d. ", i%32), 100)
				body := fmt.Sprintf(`{"model":"m","prompt":%q}`, system+fmt.Sprintf("question %d", i))
				p, err := openai.Parse(openai.Completions, []byte(body))
				if err != nil {
					b.Fatal(err)
				}
				reqs[i] = &scheduling.Request{TargetModel: "m", Body: p}
			}
			ctx := context.Background()
			pick := func(r *scheduling.Request) {
				cs := scheduling.NewCycleState()
				res, err := built.Scheduler.Schedule(ctx, cs, r, eps)
				if err != nil {
					b.Fatal(err)
				}
				for _, h := range built.PreRequest {
					h.PreRequest(ctx, cs, r, res)
				}
			}
			for _, r := range reqs { // warm the prefix index
				pick(r)
			}
			durations := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				pick(reqs[i%len(reqs)])
				durations = append(durations, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(durations)
			b.ReportMetric(float64(durations[len(durations)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(durations[len(durations)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}
