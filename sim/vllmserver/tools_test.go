package vllmserver

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestForcedToolChoice: a named or "required" tool_choice answers with a
// tool call whose arguments parse as the tool's parameters, as vLLM's
// guided decoding forces; vLLM's validation errors otherwise.
func TestForcedToolChoice(t *testing.T) {
	o := testOptions(t)
	s := startServer(t, o)
	weather := map[string]any{"type": "function", "function": map[string]any{"name": "get_weather",
		"parameters": map[string]any{"type": "object", "required": []any{"city", "days"},
			"properties": map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer", "minimum": 1}}}}}
	msgs := []map[string]any{{"role": "user", "content": "weather?"}}
	for _, tc := range []struct {
		name    string
		choice  any
		tools   []any
		stream  bool
		status  int
		wantErr string
	}{
		{name: "named", choice: map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}, tools: []any{weather}, status: 200},
		{name: "required", choice: "required", tools: []any{weather}, status: 200},
		{name: "named stream", choice: map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}, tools: []any{weather}, stream: true, status: 200},
		{name: "unknown tool", choice: map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}, tools: []any{weather}, status: 400, wantErr: "does not match any"},
		{name: "no tools", choice: "required", status: 400, wantErr: "`tools` must be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"model": o.Model, "messages": msgs, "max_tokens": 3, "tool_choice": tc.choice, "stream": tc.stream}
			if tc.tools != nil {
				body["tools"] = tc.tools
			}
			status, raw := post(t, s.URL()+"/v1/chat/completions", body)
			if status != tc.status || !strings.Contains(string(raw), tc.wantErr) {
				t.Fatalf("status %d %s, want %d with %q", status, raw, tc.status, tc.wantErr)
			}
			if status != http.StatusOK {
				return
			}
			var call toolCall
			if tc.stream {
				for _, ev := range sseEvents(t, raw) {
					var c struct {
						Choices []struct {
							Delta message `json:"delta"`
						} `json:"choices"`
					}
					if ev != "[DONE]" && json.Unmarshal([]byte(ev), &c) == nil && len(c.Choices) == 1 && len(c.Choices[0].Delta.ToolCalls) == 1 {
						call = c.Choices[0].Delta.ToolCalls[0]
					}
				}
			} else {
				var r struct {
					Choices []struct {
						Message      message `json:"message"`
						FinishReason string  `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(raw, &r); err != nil || len(r.Choices) != 1 || len(r.Choices[0].Message.ToolCalls) != 1 {
					t.Fatalf("response %s (%v): want one choice with one tool call", raw, err)
				}
				call = r.Choices[0].Message.ToolCalls[0]
			}
			var args struct {
				City *string  `json:"city"`
				Days *float64 `json:"days"`
			}
			if call.Function.Name != "get_weather" || call.Type != "function" || !strings.HasPrefix(call.ID, "chatcmpl-tool-") ||
				json.Unmarshal([]byte(call.Function.Arguments), &args) != nil || args.City == nil || args.Days == nil || *args.Days < 1 {
				t.Fatalf("tool call %+v in %s: want get_weather with the required city and days", call, raw)
			}
		})
	}
}
