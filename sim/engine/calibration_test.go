package engine

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// publishedRun is one published vLLM measurement at large batch that the
// engine replays request for request: the same prompt and output lengths,
// all sent at once, under the server's limits.
type publishedRun struct {
	name   string
	preset string
	// The server's limits as the run set them (vLLM V0 without chunked
	// prefill budgets max(max_model_len, 2048) tokens a step).
	maxNumSeqs, maxBatchedTokens, maxModelLen int
	memUtil                                   float64
	trace                                     func(t *testing.T) trace
	// What was measured: the whole run's duration, and for the serving
	// runs the median TPOT ((latency − TTFT)/(output − 1) over requests
	// with more than one output token), the mean TTFT and the earliest
	// first token (the HTTP server's start-up on the burst, which the
	// engine does not price; 0 where not published).
	duration, medianTPOT, meanTTFT, firstToken time.Duration
	// bound is how far the modelled duration may stray (model/published
	// − 1); 0 marks a run of another vLLM generation, printed for
	// comparison only.
	bound float64
}

// runMetrics are the measured quantities as the engine reproduces them.
type runMetrics struct {
	duration, medianTPOT, meanTTFT, firstToken time.Duration
	meanBatch                                  float64 // tokens generated per step, averaged over steps
	preemptions                                int64
}

func (p publishedRun) replay(t *testing.T) runMetrics {
	t.Helper()
	pr, ok := LookupPreset(p.preset)
	if !ok {
		t.Fatalf("no preset %q", p.preset)
	}
	tr := p.trace(t)
	in, out := tr.in, tr.out
	clock := NewVirtualClock(epoch)
	e := newTestEngine(t, Config{
		Timing: pr.Timing, Clock: clock, MaxNumSeqs: p.maxNumSeqs, MaxNumBatchedTokens: p.maxBatchedTokens,
		MaxModelLen: p.maxModelLen, GPUMemoryUtilization: p.memUtil, MaxWaiting: len(in),
	})
	r := rand.New(rand.NewPCG(uint64(len(in)), 7))
	arr := make([]arrival, len(in))
	for i := range in {
		// A request the benchmark counted as producing nothing still ran
		// its prefill and sampled once (an immediate end of sequence).
		arr[i] = arrival{0, Request{ID: strconv.Itoa(i), Prompt: randomPrompt(r, in[i]), MaxTokens: max(1, out[i])}}
	}
	got := simulate(t, e, clock, arr)
	var m runMetrics
	var tpots, ttfts []time.Duration
	for i := range in {
		o := got[strconv.Itoa(i)]
		last := o.tokenAt[len(o.tokenAt)-1]
		m.duration = max(m.duration, last)
		ttfts = append(ttfts, o.ttft)
		if n := len(o.tokenAt); n > 1 {
			tpots = append(tpots, (last-o.tokenAt[0])/time.Duration(n-1))
		}
	}
	slices.Sort(tpots)
	m.medianTPOT = tpots[len(tpots)/2]
	m.meanTTFT = mean(ttfts)
	m.firstToken = slices.Min(ttfts)
	em := e.Metrics()
	m.meanBatch = float64(em.GenerationTokens) / float64(max(1, em.Steps))
	m.preemptions = em.Preemptions
	return m
}

// trace is a published run's requests and, where the run published it,
// the streamed output of one of them.
type trace struct {
	in, out []int
	// streamOf is the request whose gaps between streamed chunks stream
	// holds; each chunk after the first token carries chunkTokens tokens.
	streamOf int
	stream   []time.Duration
}

// chunkTokens is how many tokens vLLM 0.6.0 streams at once under
// --num-scheduler-steps 10: one multi-step batch.
const chunkTokens = 10

// readTrace reads a testdata file of "input …", "output …" and optional
// "stream R gap-ms …" lines.
func readTrace(t *testing.T, path string) trace {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var tr trace
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		nums := make([]float64, len(fields)-1)
		for i, s := range fields[1:] {
			if nums[i], err = strconv.ParseFloat(s, 64); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
		}
		switch fields[0] {
		case "input", "output":
			ints := make([]int, len(nums))
			for i, v := range nums {
				ints[i] = int(v)
			}
			if fields[0] == "input" {
				tr.in = ints
			} else {
				tr.out = ints
			}
		case "stream":
			if len(nums) < 2 {
				t.Fatalf("%s: stream line without gaps", path)
			}
			tr.streamOf = int(nums[0])
			for _, ms := range nums[1:] {
				tr.stream = append(tr.stream, time.Duration(ms*float64(time.Millisecond)))
			}
		default:
			t.Fatalf("%s: unknown line %q", path, fields[0])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(tr.in) == 0 || len(tr.in) != len(tr.out) || tr.streamOf >= len(tr.in) {
		t.Fatalf("%s: %d input and %d output lengths, stream of request %d", path, len(tr.in), len(tr.out), tr.streamOf)
	}
	return tr
}

func fixedTrace(n, in, out int) func(*testing.T) trace {
	return func(*testing.T) trace {
		return trace{in: slices.Repeat([]int{in}, n), out: slices.Repeat([]int{out}, n)}
	}
}

func fileTrace(name string) func(*testing.T) trace {
	return func(t *testing.T) trace { return readTrace(t, "testdata/calibration/"+name) }
}

// lambdaRun is one of LambdaLabsML/vllm-benchmark's Llama-3-8B-Instruct
// runs on one H100 (results/prompt_N/1xH100-80GB-SXM/
// Meta-Llama-3-8B-Instruct_tp1_len2048.json): vLLM 0.6.0's OpenAI server,
// N ShareGPT prompts at once, under the flags its benchmark.py set. The
// published figures are the file's duration, median TPOT, mean TTFT and
// (where read) earliest TTFT, in ms.
func lambdaRun(n int, duration, tpot, ttft, first, bound float64) publishedRun {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return publishedRun{
		name: fmt.Sprintf("lambda ShareGPT %d", n), preset: "llama-3.1-8b-h100",
		maxNumSeqs: 1024, maxBatchedTokens: 2048, maxModelLen: 2048, memUtil: 0.95,
		trace:    fileTrace(fmt.Sprintf("lambda-h100-sharegpt-%d.txt", n)),
		duration: ms(duration), medianTPOT: ms(tpot), meanTTFT: ms(ttft), firstToken: ms(first), bound: bound,
	}
}

// publishedRuns are the out-of-sample checks in TIMING.md: Llama-3-8B
// (Llama-3.1-8B's shapes) on one H100, from 10 to 1,280 requests at once.
var publishedRuns = []publishedRun{
	lambdaRun(10, 5367, 7.558, 62, 62, 0.15),
	lambdaRun(40, 5944, 8.775, 261, 187, 0.15),
	lambdaRun(320, 10840, 20.034, 1629, 814, 0.15),
	lambdaRun(1280, 30605, 68.811, 6583, 0, 0.20),
	{
		// vllm-project/vllm#7117 (2024-08-04, main branch, vLLM 0.5.x
		// without multi-step scheduling): offline benchmark_throughput.py,
		// 1,000 requests of 256 in / 256 out, 24.11–24.32 req/s over three
		// trials (41.1–41.5 s).
		name: "vllm#7117 1000×(256→256)", preset: "llama-3.1-8b-h100",
		maxNumSeqs: 256, maxBatchedTokens: 8192, maxModelLen: 8192, memUtil: 0.9,
		trace:    fixedTrace(1000, 256, 256),
		duration: 41254 * time.Millisecond, // 1,000 / 24.24 req/s, the trials' mean
	},
}

// TestPublishedLargeBatch replays published vLLM runs whole and holds the
// modelled duration to them (go test -run TestPublishedLargeBatch -v
// prints TIMING.md's table).
func TestPublishedLargeBatch(t *testing.T) {
	pair := func(format string, pub, mod time.Duration) string {
		ms := func(d time.Duration) string { return fmt.Sprintf(format, float64(d)/float64(time.Millisecond)) }
		if pub == 0 {
			return "— / " + ms(mod)
		}
		return ms(pub) + " / " + ms(mod)
	}
	t.Log("| run | tokens per step | duration s: published / model | median TPOT ms | mean TTFT ms | first token ms |")
	t.Log("|---|---|---|---|---|---|")
	for _, p := range publishedRuns {
		m := p.replay(t)
		if m.preemptions > 0 {
			t.Errorf("%s: %d preemptions; the published runs fit their caches", p.name, m.preemptions)
		}
		rel := m.duration.Seconds()/p.duration.Seconds() - 1
		t.Logf("| %s | %.0f | %.2f / %.2f (%+.1f %%) | %s | %s | %s |", p.name, m.meanBatch,
			p.duration.Seconds(), m.duration.Seconds(), 100*rel,
			pair("%.1f", p.medianTPOT, m.medianTPOT), pair("%.0f", p.meanTTFT, m.meanTTFT), pair("%.0f", p.firstToken, m.firstToken))
		if p.bound > 0 && (rel > p.bound || rel < -p.bound) {
			t.Errorf("%s: modelled duration off by %+.1f %%, beyond ±%.0f %%", p.name, 100*rel, 100*p.bound)
		}
	}
}

// decodeChunks prices, chunk by chunk, the streamed output of tr's
// request tr.streamOf in a run that admitted every request before decoding
// any (vLLM V0 without chunked prefill prefills whatever waits first, and
// these runs sent every request at once): at the step producing output
// token k, each request with more than k output tokens decodes one token
// over in+k tokens of context. For every chunk after the first (which also
// waited for the other prompts' prefill) it returns the batch at the
// chunk's first step and the modelled duration of its steps.
func decodeChunks(tm Timing, tr trace) (batch []int, model []time.Duration) {
	for j := 1; j < len(tr.stream); j++ {
		var d time.Duration
		for k := chunkTokens*j + 1; k <= chunkTokens*(j+1); k++ {
			var sh Shape
			for i, n := range tr.out {
				if n > k {
					sh.DecodeSeqs++
					sh.ContextTokens += tr.in[i] + k
					sh.AttentionPairs += float64(tr.in[i] + k)
				}
			}
			sh.SampledSeqs = sh.DecodeSeqs
			if k == chunkTokens*j+1 {
				batch = append(batch, sh.DecodeSeqs)
			}
			d += tm.StepDuration(sh)
		}
		model = append(model, d)
	}
	return batch, model
}

// band sums a run's chunks at some batch sizes.
type band struct {
	chunks, batchSum int
	published, model time.Duration
}

func (b *band) add(batch int, published, model time.Duration) {
	b.chunks++
	b.batchSum += batch
	b.published += published
	b.model += model
}

func (b band) meanBatch() float64 { return float64(b.batchSum) / float64(b.chunks) }

// marginal is the growth of the mean step time from band lo's sums to band
// hi's per sequence of mean batch, in µs.
func marginal(loSum, hiSum time.Duration, lo, hi band) float64 {
	step := func(sum time.Duration, b band) float64 { return sum.Seconds() / float64(b.chunks*chunkTokens) }
	return (step(hiSum, hi) - step(loSum, lo)) / (hi.meanBatch() - lo.meanBatch()) * 1e6
}

// TestPublishedDecodeSteps holds the step model to vLLM's measured decode
// steps at batches from 1 to 300 (TIMING.md, "Against published vLLM
// measurements"; go test -run TestPublishedDecodeSteps -v prints it).
func TestPublishedDecodeSteps(t *testing.T) {
	p, _ := LookupPreset("llama-3.1-8b-h100")
	tests := []struct {
		file string
		// Bounds on model/published − 1 over the whole decode phase and
		// over its chunks at large (≥ 150 sequences) and small (≤ 20)
		// batches.
		total, large, small float64
		// marginal bounds the modelled step time one more sequence adds,
		// between the small and large bands.
		marginal float64
	}{
		{"lambda-h100-sharegpt-40.txt", 0.15, 0, 0.15, 0},
		{"lambda-h100-sharegpt-320.txt", 0.05, 0.15, 0.15, 0.40},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			tr := readTrace(t, "testdata/calibration/"+tc.file)
			batch, model := decodeChunks(p.Timing, tr)
			var all, large, small band
			for j, m := range model {
				got := tr.stream[j+1]
				all.add(batch[j], got, m)
				switch {
				case batch[j] >= 150:
					large.add(batch[j], got, m)
				case batch[j] <= 20:
					small.add(batch[j], got, m)
				}
				if j%8 == 0 {
					t.Logf("chunk %2d: batch %3d, per step published %5.2f ms, model %5.2f ms", j+1, batch[j],
						got.Seconds()*1e3/chunkTokens, m.Seconds()*1e3/chunkTokens)
				}
			}
			for _, b := range []struct {
				name  string
				band  band
				bound float64
			}{{"whole decode phase", all, tc.total}, {"batch ≥ 150", large, tc.large}, {"batch ≤ 20", small, tc.small}} {
				if b.band.chunks == 0 {
					continue
				}
				rel := b.band.model.Seconds()/b.band.published.Seconds() - 1
				t.Logf("%s (%d chunks, mean batch %.0f): published %.3f s, model %.3f s (%+.1f %%)", b.name, b.band.chunks,
					b.band.meanBatch(), b.band.published.Seconds(), b.band.model.Seconds(), 100*rel)
				if rel > b.bound || rel < -b.bound {
					t.Errorf("%s: model off by %+.1f %%, beyond ±%.0f %%", b.name, 100*rel, 100*b.bound)
				}
			}
			if large.chunks == 0 || small.chunks == 0 {
				return
			}
			// What one more decoding sequence adds to a step (its share of
			// the KV read and host time), between the two bands.
			pub, mod := marginal(small.published, large.published, small, large), marginal(small.model, large.model, small, large)
			t.Logf("marginal step time per sequence: published %.1f µs, model %.1f µs", pub, mod)
			if rel := mod/pub - 1; rel > tc.marginal || rel < -tc.marginal {
				t.Errorf("marginal step time per sequence off by %+.1f %%, beyond ±%.0f %%", 100*rel, 100*tc.marginal)
			}
		})
	}
}
