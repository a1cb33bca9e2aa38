package scheduling

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"sort"
	"time"
)

// Handle gives plugins what they may depend on, passed explicitly at build
// time. Fields other than Log and Now are optional services; a factory that
// needs a missing one fails with a configuration error.
type Handle struct {
	Log *slog.Logger
	// Now is the scheduler's clock: real time in the picker, virtual time in
	// the cluster benchmark. Plugins judge metric staleness with it.
	Now func() time.Time
	// Rand is the source of randomness for pickers; nil means the global,
	// unseeded source.
	Rand Rand
	// Plugin looks up another configured plugin by name, for plugins that
	// reference others (a P/D handler and its decider).
	Plugin func(name string) (Plugin, bool)
	// Services holds optional shared components by key (the KV index, the
	// tokenizer cache), registered by the binary that builds the picker.
	Services map[string]any
}

// Service returns the service registered under key if it has type T.
func Service[T any](h *Handle, key string) (T, bool) {
	var zero T
	if h == nil {
		return zero, false
	}
	v, ok := h.Services[key]
	if !ok {
		return zero, false
	}
	t, ok := v.(T)
	return t, ok
}

// Factory builds a plugin named name from its JSON parameters (nil when the
// configuration gave none).
type Factory func(name string, params json.RawMessage, h *Handle) (Plugin, error)

// Registry maps plugin type names to factories. Binaries build one registry
// with the plugins they ship; nothing is registered globally.
type Registry struct {
	factories map[string]Factory
	aliases   map[string]string
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: map[string]Factory{}, aliases: map[string]string{}}
}

// Register adds a plugin type. Registering a type twice is a programming
// error reported as an error.
func (r *Registry) Register(typ string, f Factory) error {
	if _, dup := r.factories[typ]; dup {
		return fmt.Errorf("plugin type %q registered twice", typ)
	}
	if _, dup := r.aliases[typ]; dup {
		return fmt.Errorf("plugin type %q already registered as an alias", typ)
	}
	r.factories[typ] = f
	return nil
}

// Alias makes alias build the same plugin as typ (GIE and llm-d renamed some
// plugins; both names keep working).
func (r *Registry) Alias(alias, typ string) error {
	if _, ok := r.factories[typ]; !ok {
		return fmt.Errorf("alias %q for unknown plugin type %q", alias, typ)
	}
	if _, dup := r.factories[alias]; dup {
		return fmt.Errorf("alias %q shadows a registered plugin type", alias)
	}
	r.aliases[alias] = typ
	return nil
}

// Types lists the registered type names and aliases, sorted.
func (r *Registry) Types() []string {
	out := make([]string, 0, len(r.factories)+len(r.aliases))
	for t := range r.factories {
		out = append(out, t)
	}
	for a := range r.aliases {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// UnknownTypeError is returned for a plugin type nobody registered.
type UnknownTypeError struct {
	Type  string
	Known []string
}

func (e *UnknownTypeError) Error() string {
	return fmt.Sprintf("unknown plugin type %q (known: %v)", e.Type, e.Known)
}

// Build constructs a plugin of type typ.
func (r *Registry) Build(typ, name string, params json.RawMessage, h *Handle) (Plugin, error) {
	if canonical, ok := r.aliases[typ]; ok {
		typ = canonical
	}
	f, ok := r.factories[typ]
	if !ok {
		return nil, &UnknownTypeError{Type: typ, Known: r.Types()}
	}
	return f(name, params, h)
}

// DecodeParams strictly decodes plugin parameters into v: unknown fields are
// errors, so that a misspelt parameter is not silently ignored. Empty or null
// parameters leave v's defaults.
func DecodeParams(params json.RawMessage, v any) error {
	trimmed := bytes.TrimSpace(params)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if name := failingParam(trimmed, v); name != "" {
			return fmt.Errorf("parameters.%s: %w", name, err)
		}
		return fmt.Errorf("parameters: %w", err)
	}
	return nil
}

// failingParam is the first parameter (in the document's order) whose value
// alone fails to decode into a new value of v's type, "" when none does.
// A type's own UnmarshalJSON (a duration's) returns errors that do not
// say which field they were decoding; without the name, "time: invalid
// duration" in a config of several durations leaves the reader guessing.
func failingParam(params []byte, v any) string {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		tok, err := dec.Token()
		name, ok := tok.(string)
		var value json.RawMessage
		if err != nil || !ok || dec.Decode(&value) != nil {
			return ""
		}
		one, err := json.Marshal(map[string]json.RawMessage{name: value})
		if err == nil && json.Unmarshal(one, reflect.New(t.Elem()).Interface()) != nil {
			return name
		}
	}
	return ""
}

// Rand is the randomness pickers draw from. The picker uses a lock-free
// global source; the cluster benchmark injects a seeded one so that runs are
// reproducible.
type Rand interface {
	Float64() float64
	IntN(n int) int
}

// RandOf returns the handle's Rand, or the global source.
func RandOf(h *Handle) Rand {
	if h != nil && h.Rand != nil {
		return h.Rand
	}
	return globalRand{}
}

type globalRand struct{}

func (globalRand) Float64() float64 { return rand.Float64() }
func (globalRand) IntN(n int) int   { return rand.IntN(n) }

// NowOf returns the handle's clock, or time.Now.
func NowOf(h *Handle) func() time.Time {
	if h != nil && h.Now != nil {
		return h.Now
	}
	return time.Now
}
