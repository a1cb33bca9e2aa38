package workload

import (
	"bufio"
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

func firstLines(t *testing.T, path string, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("trace absent: %v", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for i := 0; i < n && sc.Scan(); i++ {
		buf.Write(sc.Bytes())
		buf.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestLoadMooncakeRealTrace(t *testing.T) {
	data := firstLines(t, filepath.Join(testutil.SharedDir(t), "traces", "mooncake_synthetic_trace.jsonl"), 200)
	reqs, err := LoadMooncake(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 200 {
		t.Fatalf("got %d requests", len(reqs))
	}
	// The first line: timestamp 0, 40,160 input tokens in 79 blocks of 512
	// (the last one partial), 6 output tokens.
	r0 := reqs[0]
	if r0.Arrival != 0 || r0.PromptLen() != 40160 || len(r0.Segments) != 79 || r0.OutputTokens != 6 {
		t.Fatalf("first request: arrival %v, %d tokens in %d segments, %d out", r0.Arrival, r0.PromptLen(), len(r0.Segments), r0.OutputTokens)
	}
	if last := r0.Segments[78].Len; last != 40160-78*512 {
		t.Fatalf("last block has %d tokens", last)
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].Arrival < reqs[i-1].Arrival {
			t.Fatal("requests not in arrival order")
		}
	}
	// Requests whose leading hash ids agree must have identical leading
	// token blocks, and differ from the first differing block on.
	pairs := 0
	for k := 0; k < len(reqs)*len(reqs) && pairs < 5; k++ {
		i, j := k/len(reqs), k%len(reqs)
		if i >= j {
			continue
		}
		a, b := reqs[i], reqs[j]
		common := 0
		for common < min(len(a.Segments), len(b.Segments)) && a.Segments[common] == b.Segments[common] {
			common++
		}
		if common == 0 || common == len(a.Segments) || common == len(b.Segments) {
			continue
		}
		pairs++
		pa, pb := a.Prompt(0), b.Prompt(0)
		n := common * MooncakeBlockTokens
		if !slices.Equal(pa[:n], pb[:n]) {
			t.Fatalf("requests %d and %d share %d blocks but not their tokens", i, j, common)
		}
		m := n + min(a.Segments[common].Len, b.Segments[common].Len)
		if slices.Equal(pa[n:m], pb[n:m]) {
			t.Fatalf("requests %d and %d: different hash ids gave identical tokens", i, j)
		}
	}
	if pairs == 0 {
		t.Fatal("no two requests in the first lines share a prefix")
	}
}

func TestParseMooncakeErrors(t *testing.T) {
	tests := []struct {
		name, line string
		ok         bool
	}{
		{"minimal", `{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1]}`, true},
		{"no hash ids", `{"timestamp": 5, "input_length": 10, "output_length": 1}`, true},
		{"fractional timestamp", `{"timestamp": 5.5, "input_length": 10, "output_length": 1, "hash_ids": []}`, true},
		{"missing input", `{"timestamp": 5, "output_length": 1}`, false},
		{"zero output", `{"timestamp": 5, "input_length": 10, "output_length": 0}`, false},
		{"negative timestamp", `{"timestamp": -1, "input_length": 10, "output_length": 1}`, false},
		{"huge input", `{"timestamp": 1, "input_length": 99999999999, "output_length": 1}`, false},
		{"negative hash id", `{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [-1]}`, false},
		{"not an object", `[1,2]`, false},
	}
	for _, tc := range tests {
		_, err := LoadMooncake(strings.NewReader(tc.line + "\n\n"))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v", tc.name, err)
		}
		if err != nil && !errors.Is(err, ErrTrace) {
			t.Errorf("%s: error %v does not wrap ErrTrace", tc.name, err)
		}
	}
}

// More hash ids than the input needs are cut; fewer leave an unshared tail.
func TestMooncakeBlockCoverage(t *testing.T) {
	reqs, err := LoadMooncake(strings.NewReader(
		`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := []int{len(reqs[0].Segments), reqs[0].PromptLen(), len(reqs[1].Segments), reqs[1].PromptLen()}; !slices.Equal(got, []int{2, 600, 2, 1100}) {
		t.Fatalf("segments/lengths %v", got)
	}
	if !slices.Equal(reqs[0].Prompt(0)[:512], reqs[1].Prompt(0)[:512]) {
		t.Fatal("shared hash id 1 gave different tokens")
	}
	if got := reqs[1].Prompt(700); len(got) != 700 || !slices.Equal(got, reqs[1].Prompt(0)[:700]) {
		t.Fatal("clipping must keep the prompt's head")
	}
}

func FuzzLoadMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 40, "output_length": 6, "hash_ids": [0, 1]}`))
	f.Add([]byte("{\"timestamp\": 1e3, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\n\n{}"))
	f.Add([]byte(`{"timestamp": null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := LoadMooncake(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, r := range reqs {
			n := r.PromptLen()
			if n < 1 || n > maxInputTokens || r.OutputTokens < 1 || r.Arrival < 0 {
				t.Fatalf("accepted request %+v", r)
			}
			if got := len(r.Prompt(min(n, 4096))); got != min(n, 4096) {
				t.Fatalf("prompt of %d tokens for length %d", got, n)
			}
		}
	})
}

func TestSharedPrefix(t *testing.T) {
	c := SharedPrefix{Groups: 4, PrefixTokens: 100, SuffixTokens: 20, OutputTokens: 5,
		Stages: []Stage{{QPS: 50, Duration: 20 * time.Second}, {QPS: 200, Duration: 10 * time.Second}}}
	a, err := c.Generate(7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.Generate(7)
	if !slices.EqualFunc(a, b, func(x, y Request) bool {
		return x.Arrival == y.Arrival && slices.Equal(x.Segments, y.Segments)
	}) {
		t.Fatal("same seed gave different workloads")
	}
	// Poisson counts: 1,000 and 2,000 expected; 5 standard deviations.
	count := map[float64]int{}
	prefixes := map[uint64]bool{}
	suffixes := map[uint64]bool{}
	for i, r := range a {
		count[r.OfferedQPS]++
		if r.PromptLen() != 120 || len(r.Segments) != 2 {
			t.Fatalf("request %d: %d tokens", i, r.PromptLen())
		}
		prefixes[r.Segments[0].Key] = true
		suffixes[r.Segments[1].Key] = true
		if i > 0 && r.Arrival < a[i-1].Arrival {
			t.Fatal("not in arrival order")
		}
	}
	for qps, want := range map[float64]float64{50: 1000, 200: 2000} {
		if d := math.Abs(float64(count[qps]) - want); d > 5*math.Sqrt(want) {
			t.Errorf("stage %v QPS: %d requests, want ≈ %v", qps, count[qps], want)
		}
	}
	if len(prefixes) != 4 || len(suffixes) != len(a) {
		t.Fatalf("%d prefixes (want 4), %d unique suffixes for %d requests", len(prefixes), len(suffixes), len(a))
	}
	for _, bad := range []SharedPrefix{{}, {Groups: 1, PrefixTokens: 1, OutputTokens: 1}, {Groups: 1, PrefixTokens: 1, OutputTokens: 1, Stages: []Stage{{QPS: 1e9, Duration: time.Hour}}}} {
		if _, err := bad.Generate(1); !errors.Is(err, ErrWorkload) {
			t.Errorf("%+v: err = %v", bad, err)
		}
	}
}

func TestChatTurnsExtendTheConversation(t *testing.T) {
	c := Chat{SystemPrompts: 2, SystemTokens: 50, UserTokens: 10, OutputTokens: 7, Turns: 3, ThinkTime: time.Second,
		Stages: []Stage{{QPS: 2, Duration: 10 * time.Second}}}
	reqs, err := c.Generate(3)
	if err != nil {
		t.Fatal(err)
	}
	// Group by system prompt + first user message: one conversation.
	convs := map[Segment][]Request{}
	for _, r := range reqs {
		convs[r.Segments[1]] = append(convs[r.Segments[1]], r)
	}
	if len(convs) == 0 {
		t.Fatal("no conversations")
	}
	for _, turns := range convs {
		if len(turns) != 3 {
			t.Fatalf("conversation with %d turns", len(turns))
		}
		for k := 1; k < len(turns); k++ {
			prev, cur := turns[k-1], turns[k]
			if cur.Arrival-prev.Arrival != time.Second {
				t.Fatalf("think time %v", cur.Arrival-prev.Arrival)
			}
			if !slices.Equal(cur.Segments[:len(prev.Segments)], prev.Segments) || cur.PromptLen() != prev.PromptLen()+7+10 {
				t.Fatal("a turn must extend the previous prompt by its reply and a new message")
			}
		}
	}
}

func TestScaleQPS(t *testing.T) {
	in := []Request{{Arrival: 10 * time.Second, OfferedQPS: 3}, {Arrival: 20 * time.Second}}
	out := ScaleQPS(in, 4)
	if out[0].Arrival != 2500*time.Millisecond || out[1].Arrival != 5*time.Second || out[0].OfferedQPS != 12 {
		t.Fatalf("scaled: %+v", out)
	}
	if in[0].Arrival != 10*time.Second {
		t.Fatal("input modified")
	}
}
