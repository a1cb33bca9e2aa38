package workload

import (
	"strings"
	"testing"
)

// BenchmarkBuild measures turning 200 trace entries (40 blocks each, half
// of them shared) into prompts: the work `kvgate up` does before a run.
func BenchmarkBuild(b *testing.B) {
	entries := make([]Entry, 200)
	for i := range entries {
		ids := make([]uint64, 40)
		for j := range ids {
			if j < 20 {
				ids[j] = uint64(j + 1000*(i%10)) // ten shared 20-block prefixes
			} else {
				ids[j] = uint64(1_000_000 + 40*i + j)
			}
		}
		entries[i] = Entry{Timestamp: float64(i * 100), OutputLength: 50, HashIDs: ids}
	}
	o := DefaultOptions()
	var bytes int
	for b.Loop() {
		reqs := Build(entries, o)
		bytes = 0
		for _, r := range reqs {
			bytes += len(r.Prompt)
		}
	}
	b.ReportMetric(float64(bytes)/1e6, "MB_prompt/op")
}

// BenchmarkReadStream measures parsing one streamed completion of 32
// token events plus its usage record.
func BenchmarkReadStream(b *testing.B) {
	var sb strings.Builder
	for range 32 {
		sb.WriteString("data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" word\"}]}\n\n")
	}
	sb.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3000,\"completion_tokens\":32,\"prompt_tokens_details\":{\"cached_tokens\":2900}}}\n\ndata: [DONE]\n\n")
	s := sb.String()
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		if _, err := ReadStream(strings.NewReader(s), nil); err != nil {
			b.Fatal(err)
		}
	}
}
