package workload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestReadTrace(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		limit   int
		want    int
		wantErr bool
	}{
		{"two", `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}` + "\n" + `{"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [0]}`, 0, 2, false},
		{"limit", "{\"timestamp\":0,\"input_length\":5,\"output_length\":1,\"hash_ids\":[1]}\n{\"timestamp\":1,\"input_length\":5,\"output_length\":1,\"hash_ids\":[2]}\n", 1, 1, false},
		{"blank lines", "\n{\"timestamp\":0,\"input_length\":5,\"output_length\":1,\"hash_ids\":[1]}\n\n", 0, 1, false},
		// `kvgate bench` loads this trace; `kvgate up` must too.
		{"fractional timestamp", `{"timestamp": 27.5, "input_length": 10, "output_length": 1, "hash_ids": [3]}`, 0, 1, false},
		{"no hash ids", `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}`, 0, 0, true},
		{"negative", `{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}`, 0, 0, true},
		{"no lengths", `{"timestamp": 0, "hash_ids": [1]}`, 0, 0, true},
		{"not json", `{"timestamp": `, 0, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadTrace(strings.NewReader(tc.in), tc.limit)
			if tc.wantErr {
				if !errors.Is(err, ErrBadEntry) {
					t.Fatalf("err = %v, want ErrBadEntry", err)
				}
				return
			}
			if err != nil || len(got) != tc.want {
				t.Fatalf("got %d entries, %v; want %d", len(got), err, tc.want)
			}
		})
	}
}

func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`))
	f.Add([]byte("{\"hash_ids\":[1]}\n{\"hash_ids\":null}\n"))
	f.Add([]byte(`{"timestamp": 1e30, "hash_ids": [1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ReadTrace(strings.NewReader(string(data)), 0)
		if err != nil {
			return
		}
		for _, e := range entries {
			if len(e.HashIDs) == 0 || e.Timestamp < 0 {
				t.Fatalf("accepted invalid entry %+v", e)
			}
		}
		// Whatever parses must also select and build without panicking.
		Build(Select(entries, 3), DefaultOptions())
	})
}

func TestSelectTakesTheMostSharedGroupsInTraceOrder(t *testing.T) {
	entries := []Entry{
		{Timestamp: 0, HashIDs: []uint64{1, 2}},
		{Timestamp: 1, HashIDs: []uint64{7}},
		{Timestamp: 2, HashIDs: []uint64{1, 2, 3}},
		{Timestamp: 3, HashIDs: []uint64{9}},
		{Timestamp: 4, HashIDs: []uint64{1, 5}},
		{Timestamp: 5, HashIDs: []uint64{9, 4}},
	}
	got := Select(entries, 5)
	var ts []float64
	for _, e := range got {
		ts = append(ts, e.Timestamp)
	}
	// Group 1 (three entries), then group 9 (two); group 7 left out.
	if fmt.Sprint(ts) != "[0 2 3 4 5]" {
		t.Fatalf("selected timestamps %v", ts)
	}
}

func TestBuildSharesPrefixText(t *testing.T) {
	o := Options{WordsPerBlock: 8, MaxBlocks: 3, MaxOutputTokens: 10, Duration: 10 * time.Second}
	reqs := Build([]Entry{
		{Timestamp: 100, OutputLength: 50, HashIDs: []uint64{4, 5, 6, 7}},
		{Timestamp: 300, OutputLength: 3, HashIDs: []uint64{4, 5, 8}},
	}, o)
	if reqs[0].At != 0 || reqs[1].At != 10*time.Second {
		t.Errorf("arrivals %v, %v", reqs[0].At, reqs[1].At)
	}
	if reqs[0].MaxTokens != 10 || reqs[1].MaxTokens != 3 || reqs[0].Blocks != 3 {
		t.Errorf("max tokens %d, %d; blocks %d", reqs[0].MaxTokens, reqs[1].MaxTokens, reqs[0].Blocks)
	}
	shared := chunk(4, 8) + chunk(5, 8)
	if !strings.HasPrefix(reqs[0].Prompt, shared) || !strings.HasPrefix(reqs[1].Prompt, shared) || reqs[0].Prompt == reqs[1].Prompt {
		t.Errorf("prompts do not share exactly the common blocks:\n%q\n%q", reqs[0].Prompt, reqs[1].Prompt)
	}
	if n := len(strings.Fields(reqs[0].Prompt)); n != 24 {
		t.Errorf("prompt has %d words, want 24", n)
	}
}

func TestReadStream(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		cached  int
		wantErr error
	}{
		{"usage", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n", 8, nil},
		{"no usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", 0, ErrNoUsage},
		{"truncated", "data: {\"choices\":[]}\n\n", 0, ErrTruncated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			firsts := 0
			u, err := ReadStream(strings.NewReader(tc.in), func() { firsts++ })
			if !errors.Is(err, tc.wantErr) || u.PromptTokensDetails.CachedTokens != tc.cached || firsts != 1 {
				t.Fatalf("usage %+v, err %v, first called %d times", u, err, firsts)
			}
		})
	}
	if _, err := ReadStream(strings.NewReader("data: {\"error\":{\"message\":\"boom\"}}\n"), nil); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error event: %v", err)
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n")
	f.Add("event: x\ndata:[DONE]\n")
	f.Add("data: {\"error\":{}}\n")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ReadStream(strings.NewReader(s), nil)
	})
}

// TestReplay runs requests against an OpenAI-style streaming server over
// loopback and checks every one is measured.
func TestBatchPromptsShareNoBlock(t *testing.T) {
	reqs := Batch(3, 8, 5, 4*time.Second, 7)
	if reqs[0].At != 0 || reqs[1].At != 2*time.Second || reqs[2].At != 4*time.Second {
		t.Errorf("arrivals %v %v %v", reqs[0].At, reqs[1].At, reqs[2].At)
	}
	seen := map[string]bool{}
	for _, r := range reqs {
		if r.MaxTokens != 5 || len(strings.Fields(r.Prompt)) != 8 || seen[r.Prompt[:16]] {
			t.Errorf("request %+v", r)
		}
		seen[r.Prompt[:16]] = true
	}
	if other := Batch(1, 8, 5, 0, 8); other[0].Prompt == reqs[0].Prompt {
		t.Error("two jobs' prompts are equal")
	}
}

func TestReplay(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("X-Class") == "refused" {
			http.Error(w, "shed", http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	reqs := []Request{{Prompt: "a", MaxTokens: 1}, {At: time.Millisecond, Prompt: "b", MaxTokens: 1}}
	var calls atomic.Int32 // progress runs on the requests' goroutines
	res := Replay(context.Background(), Target{URL: srv.URL + "/v1/completions", Model: "m", Client: srv.Client()}, reqs, func(int) { calls.Add(1) })
	for i, r := range res {
		if !r.OK() || r.Index != i || r.CachedTokens != 2 || r.PromptTokens != 5 || r.TTFT <= 0 || r.TTFT > r.Latency {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if calls.Load() != 2 {
		t.Errorf("progress called %d times", calls.Load())
	}
	bad := Target{URL: srv.URL + "/nope", Model: "m", Client: srv.Client()}.Do(context.Background(), reqs[0])
	if bad.OK() || bad.Status != http.StatusNotFound {
		t.Errorf("404 result %+v", bad)
	}
	shed := Target{URL: srv.URL + "/v1/completions", Model: "m", Client: srv.Client(), Header: http.Header{"X-Class": {"refused"}}}.Do(context.Background(), reqs[0])
	if shed.OK() || shed.Status != http.StatusTooManyRequests {
		t.Errorf("the target's header did not reach the server: %+v", shed)
	}
}
