package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
)

// api is one of the request paths the sidecar intercepts.
type api struct {
	path string
	name string // the api_type metric label
	// limits are the output-token caps a prefill or encode leg forces to 1;
	// inSampling puts them in sampling_params (vLLM's generate API).
	limits     []string
	inSampling bool
	// store pins store=false on synthetic legs (the Responses API keeps
	// outputs by default).
	store bool
}

// apis are the POST paths llm-d's sidecar runs P/D for; every other path
// goes straight to the local model server.
var apis = []api{
	{path: "/v1/chat/completions", name: "chat_completions", limits: []string{"max_tokens", "max_completion_tokens"}},
	{path: "/v1/completions", name: "completions", limits: []string{"max_tokens"}},
	{path: "/v1/messages", name: "messages", limits: []string{"max_tokens"}},
	{path: "/v1/responses", name: "responses", limits: []string{"max_output_tokens"}, store: true},
	{path: "/inference/v1/generate", name: "generate", limits: []string{"max_tokens"}, inSampling: true},
}

// body is a request's top-level JSON fields. Legs are built from clones,
// so the client's fields stay as sent for the decode leg.
type body map[string]json.RawMessage

var errNotObject = errors.New("the request body is not a JSON object")

func parseBody(b []byte) (body, error) {
	var m body
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if m == nil {
		return nil, errNotObject
	}
	return m, nil
}

func (b body) clone() body { return maps.Clone(b) }

func (b body) set(key string, v any) {
	// Only values built here (maps, strings, numbers, raw JSON) are set,
	// and they always marshal.
	raw, _ := json.Marshal(v)
	b[key] = raw
}

func (b body) marshal() []byte {
	out, _ := json.Marshal(map[string]json.RawMessage(b)) // RawMessages are valid JSON
	return out
}

// stream reports the request's "stream": true.
func (b body) stream() bool {
	var s bool
	return json.Unmarshal(b["stream"], &s) == nil && s
}

// capSingleToken turns b into a non-streaming one-output-token leg:
// llm-d's prefill and encode legs. min_tokens is dropped rather than
// capped: vLLM refuses min_tokens > max_tokens, and its default is 0.
func (b body) capSingleToken(a api) {
	if a.inSampling {
		sp := map[string]json.RawMessage{}
		_ = json.Unmarshal(b["sampling_params"], &sp) // absent or not an object: a fresh one
		if sp == nil {
			sp = map[string]json.RawMessage{}
		}
		for _, f := range a.limits {
			sp[f] = json.RawMessage("1")
		}
		delete(sp, "min_tokens")
		b.set("sampling_params", sp)
	} else {
		for _, f := range a.limits {
			b[f] = json.RawMessage("1")
		}
		// Whatever cap the client sent, under another API's name too, is
		// capped as well: a server reading it must not generate more.
		if _, ok := b["max_completion_tokens"]; ok {
			b["max_completion_tokens"] = json.RawMessage("1")
		}
		delete(b, "min_tokens")
	}
	b["stream"] = json.RawMessage("false")
	delete(b, "stream_options")
	if a.store {
		b["store"] = json.RawMessage("false")
	}
}

// setPath returns doc, a JSON object, with the value at path (object keys
// from the top) replaced by value, creating the objects on the way where a
// key is absent, null or not an object. The bytes outside the changed
// value stay as they were, key order included, so a rewritten response
// differs from the model server's only where it must.
func setPath(doc []byte, value json.RawMessage, path ...string) ([]byte, error) {
	if len(path) == 0 {
		return nil, errors.New("setPath: empty path")
	}
	start, end, found, closeAt, err := findKey(doc, path[0])
	if err != nil {
		return nil, err
	}
	if found && len(path) > 1 && doc[start] == '{' {
		inner, err := setPath(doc[start:end], value, path[1:]...)
		if err != nil {
			return nil, err
		}
		return splice(doc, start, end, inner), nil
	}
	v := value
	for i := len(path) - 1; i >= 1; i-- {
		k, _ := json.Marshal(path[i])
		v = append(append(append(append([]byte("{"), k...), ':'), v...), '}')
	}
	if found {
		return splice(doc, start, end, v), nil
	}
	k, _ := json.Marshal(path[0])
	ins := append(append(k, ':'), v...)
	if !emptyObject(doc[:closeAt]) {
		ins = append([]byte(","), ins...)
	}
	return splice(doc, closeAt, closeAt, ins), nil
}

func splice(doc []byte, start, end int, with []byte) []byte {
	out := make([]byte, 0, len(doc)-(end-start)+len(with))
	out = append(out, doc[:start]...)
	out = append(out, with...)
	return append(out, doc[end:]...)
}

// emptyObject reports whether head, an object's bytes up to its closing
// brace, has no member.
func emptyObject(head []byte) bool {
	return bytes.Equal(bytes.TrimSpace(head), []byte("{"))
}

// findKey locates key among doc's top-level members: the value's span
// when found (the last one, as encoding/json would read a repeated key),
// and the offset of the object's closing brace.
func findKey(doc []byte, key string) (start, end int, found bool, closeAt int, err error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return 0, 0, false, 0, errNotObject
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return 0, 0, false, 0, err
		}
		k, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return 0, 0, false, 0, err
		}
		if k == key {
			end = int(dec.InputOffset())
			start, found = end-len(raw), true
		}
	}
	if _, err := dec.Token(); err != nil {
		return 0, 0, false, 0, err
	}
	closeAt = int(dec.InputOffset()) - 1
	if len(bytes.TrimSpace(doc[closeAt+1:])) > 0 {
		return 0, 0, false, 0, errors.New("data after the JSON object")
	}
	return start, end, found, closeAt, nil
}
