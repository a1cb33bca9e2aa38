package vllmserver

import (
	"encoding/json"
	"sort"
)

// toolCall is one entry of a message's tool_calls; Index is set in stream
// deltas only, as vLLM's DeltaToolCall carries it.
type toolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// forcedTool is the call a named or "required" tool_choice makes vLLM's
// guided decoding emit in place of text.
type forcedTool struct {
	call     toolCall
	required bool // finish_reason "tool_calls" where the model stopped
}

// toolSpec is what the simulator reads of a request's tools.
type toolSpec struct {
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// forcedToolOf applies vLLM's tool_choice validation to a chat body and
// returns the call it forces; nil for "auto", "none" or no tool_choice.
func (s *Server) forcedToolOf(tools []toolSpec, choice json.RawMessage) (*forcedTool, *apiError) {
	if len(choice) == 0 || string(choice) == "null" {
		return nil, nil
	}
	var mode string
	var named struct {
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	isMode := json.Unmarshal(choice, &mode) == nil
	if isMode && mode == "none" {
		return nil, nil
	}
	if tools == nil {
		return nil, badRequest("When using `tool_choice`, `tools` must be set.")
	}
	var tool *toolSpec
	switch {
	case isMode && mode == "auto":
		return nil, nil
	case isMode && mode == "required":
		if len(tools) == 0 {
			return nil, nil // vLLM treats it as "none", as OpenAI does
		}
		tool = &tools[0]
	case isMode:
		return nil, badRequest("Invalid value for `tool_choice`: %s! Only named tools, \"none\", \"auto\" or \"required\" are supported.", mode)
	default:
		if json.Unmarshal(choice, &named) != nil || named.Function == nil || named.Function.Name == "" {
			return nil, badRequest("Invalid value for `function` in `tool_choice`! Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`")
		}
		for i := range tools {
			if tools[i].Function.Name == named.Function.Name {
				tool = &tools[i]
				break
			}
		}
		if tool == nil {
			return nil, badRequest("The tool specified in `tool_choice` does not match any of the specified `tools`")
		}
	}
	var schema any
	_ = json.Unmarshal(tool.Function.Parameters, &schema)
	args, err := json.Marshal(minimalValue(schema, 0))
	if err != nil {
		return nil, badRequest("tool parameters: %v", err)
	}
	return &forcedTool{required: isMode,
		call: toolCall{ID: "chatcmpl-tool-" + s.newID("")[1:], Type: "function",
			Function: toolFunction{Name: tool.Function.Name, Arguments: string(args)}}}, nil
}

// maxSchemaDepth bounds minimalValue's recursion through a client's schema.
const maxSchemaDepth = 32

// minimalValue is the smallest value schema accepts that a guided decoder
// could emit: an object of its required properties, the first enum or
// const, a type's zero. A missing or unreadable schema gives {}.
func minimalValue(schema any, depth int) any {
	m, ok := schema.(map[string]any)
	if !ok || depth > maxSchemaDepth {
		return map[string]any{}
	}
	if c, ok := m["const"]; ok {
		return c
	}
	if e, ok := m["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	typ := m["type"]
	if ts, ok := typ.([]any); ok && len(ts) > 0 {
		typ = ts[0]
	}
	switch typ {
	case "string":
		return ""
	case "integer", "number":
		if v, ok := m["minimum"].(float64); ok {
			return v
		}
		return 0
	case "boolean":
		return false
	case "null":
		return nil
	case "array":
		return []any{}
	}
	out := map[string]any{}
	props, _ := m["properties"].(map[string]any)
	req, _ := m["required"].([]any)
	names := make([]string, 0, len(req))
	for _, r := range req {
		if name, ok := r.(string); ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		out[name] = minimalValue(props[name], depth+1)
	}
	return out
}

// finishReason is vLLM's for a forced call: "tool_calls" where a
// "required" call ended on stop, the engine's reason otherwise.
func (t *forcedTool) finishReason(reason string) string {
	if t.required && reason == "stop" {
		return "tool_calls"
	}
	return reason
}
