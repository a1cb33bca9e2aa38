package openai

import (
	"strings"
	"testing"
)

func TestUsageScanner(t *testing.T) {
	tests := []struct {
		name      string
		streaming bool
		body      string
		want      Usage
		found     bool
		done      bool
	}{
		{name: "chat json", body: `{"id":"x","choices":[{"message":{"content":"usage: {\"prompt_tokens\":9}"}}],` +
			`"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":8}}}`,
			want: Usage{PromptTokens: 12, CompletionTokens: 5, CachedTokens: 8}, found: true},
		{name: "usage first", body: `{"usage":{"prompt_tokens":1,"completion_tokens":2},"data":[{"embedding":[0.1,0.2]}]}`,
			want: Usage{PromptTokens: 1, CompletionTokens: 2}, found: true},
		{name: "nested usage ignored", body: `{"choices":[{"usage":{"prompt_tokens":1}}],"x":{"usage":{"prompt_tokens":2}}}`},
		{name: "null usage", body: `{"usage":null}`},
		{name: "responses object", body: `{"object":"response","usage":{"input_tokens":4,"output_tokens":6,"input_tokens_details":{"cached_tokens":2}}}`,
			want: Usage{PromptTokens: 4, CompletionTokens: 6, CachedTokens: 2}, found: true},
		{name: "not json", body: `}}}{{{"usage":`},
		{name: "error body", body: `{"error":{"message":"bad"}}`},
		{name: "sse with usage", streaming: true, body: "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n" +
			"data: [DONE]\n\n",
			want: Usage{PromptTokens: 3, CompletionTokens: 1, CachedTokens: 2}, found: true, done: true},
		{name: "sse crlf and comments", streaming: true, body: ": keep-alive\r\n\r\ndata:{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\r\n\r\ndata: [DONE]\r\n\r\n",
			want: Usage{PromptTokens: 3, CompletionTokens: 4}, found: true, done: true},
		{name: "sse multi-line data", streaming: true, body: "event: x\ndata: {\"usage\":\ndata: {\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n",
			want: Usage{PromptTokens: 5, CompletionTokens: 6}, found: true},
		{name: "sse last event without blank line", streaming: true, body: "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}",
			want: Usage{PromptTokens: 1, CompletionTokens: 1}, found: true},
		{name: "sse responses completed", streaming: true,
			body: "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":7,\"output_tokens\":8}}}\n\n",
			want: Usage{PromptTokens: 7, CompletionTokens: 8}, found: true},
		{name: "sse no usage", streaming: true, body: "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", done: true},
		{name: "sse done is exact", streaming: true, body: "data: [DONE]x\n\n"},
		{name: "sse other field", streaming: true, body: "id: {\"usage\":{\"prompt_tokens\":1}}\n\n"},
		{name: "sse datax field", streaming: true, body: "datax: {\"usage\":{\"prompt_tokens\":1}}\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every split point must give the same answer: chunk boundaries
			// are wherever the network put them.
			for split := 0; split <= len(tt.body); split++ {
				s := NewUsageScanner(tt.streaming)
				s.Write([]byte(tt.body[:split]))
				s.Write([]byte(tt.body[split:]))
				s.Close()
				got, found := s.Usage()
				if got != tt.want || found != tt.found || s.Done() != tt.done {
					t.Fatalf("split %d: got %+v found=%v done=%v; want %+v found=%v done=%v",
						split, got, found, s.Done(), tt.want, tt.found, tt.done)
				}
			}
			// And byte by byte.
			s := NewUsageScanner(tt.streaming)
			for i := 0; i < len(tt.body); i++ {
				s.Write([]byte{tt.body[i]})
			}
			s.Close()
			if got, found := s.Usage(); got != tt.want || found != tt.found {
				t.Fatalf("bytewise: got %+v found=%v", got, found)
			}
		})
	}
}

func TestUsageScannerBounded(t *testing.T) {
	// A huge "usage" value is dropped, not buffered.
	body := `{"usage":{"prompt_tokens":1,"pad":"` + strings.Repeat("x", 10*maxUsageBytes) + `"}}`
	s := NewUsageScanner(false)
	s.Write([]byte(body))
	s.Close()
	if _, found := s.Usage(); found {
		t.Fatal("oversized usage accepted")
	}
	if cap(s.doc.capture) > 2*maxUsageBytes {
		t.Fatalf("capture buffer grew to %d", cap(s.doc.capture))
	}
}

func TestUsageScannerReset(t *testing.T) {
	s := NewUsageScanner(true)
	s.Write([]byte("data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"))
	s.Reset(false)
	if _, found := s.Usage(); found || s.Done() {
		t.Fatal("Reset kept state")
	}
	s.Write([]byte(`{"usage":{"prompt_tokens":2,"completion_tokens":3}}`))
	if u, _ := s.Usage(); u.PromptTokens != 2 {
		t.Fatalf("after reset: %+v", u)
	}
}

func FuzzUsageScanner(f *testing.F) {
	f.Add(true, []byte("data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"), uint8(7))
	f.Add(false, []byte(`{"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}}`), uint8(3))
	f.Add(true, []byte("event: e\r\ndata: {\"response\":{\"usage\":{\"input_tokens\":1}}}\r\n\r\n"), uint8(1))
	f.Add(false, []byte(`]]]}}}"\`), uint8(0))
	f.Fuzz(func(t *testing.T, streaming bool, body []byte, step uint8) {
		whole := NewUsageScanner(streaming)
		whole.Write(body)
		whole.Close()
		u1, ok1 := whole.Usage()

		chunked := NewUsageScanner(streaming)
		n := int(step) + 1
		for i := 0; i < len(body); i += n {
			chunked.Write(body[i:min(i+n, len(body))])
		}
		chunked.Close()
		u2, ok2 := chunked.Usage()
		if u1 != u2 || ok1 != ok2 || whole.Done() != chunked.Done() {
			t.Fatalf("chunking changed the result: %+v/%v/%v vs %+v/%v/%v", u1, ok1, whole.Done(), u2, ok2, chunked.Done())
		}
		if cap(chunked.doc.capture) > 2*maxUsageBytes {
			t.Fatalf("capture buffer grew to %d", cap(chunked.doc.capture))
		}
	})
}

func BenchmarkUsageScannerSSE(b *testing.B) {
	var sb strings.Builder
	for range 200 {
		sb.WriteString("data: {\"id\":\"cmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token \"}}],\"usage\":null}\n\n")
	}
	sb.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":200}}\n\ndata: [DONE]\n\n")
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var s UsageScanner
	for b.Loop() {
		s.Reset(true)
		s.Write(body)
		s.Close()
		if u, ok := s.Usage(); !ok || u.CompletionTokens != 200 {
			b.Fatal("usage not found")
		}
	}
}
