package scheduling

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// Plugin kinds outside the Filter → Score → Pick pipeline, named by the
// sections of an EndpointPickerConfig that reference them. They are marker
// interfaces: what each kind yields is read by the configuration loader
// through its own small interfaces.

// DataSource collects per-endpoint data for the data layer (llm-d's
// dataLayer.sources), for example the model servers' /metrics pages.
type DataSource interface {
	Plugin
	DataLayerSource()
}

// DataExtractor turns a data source's output into endpoint attributes
// (dataLayer.sources[].extractors). AcceptsSource reports whether it can
// read source, with the reason when not.
type DataExtractor interface {
	Plugin
	AcceptsSource(source DataSource) error
}

// RequestParser names a request format the picker parses
// (requestHandler.parsers).
type RequestParser interface {
	Plugin
	RequestParser()
}

// Resolver is implemented by plugins that refer to other configured plugins
// by name (a scorer reading a named producer's data): the loader calls
// Resolve once every plugin is built, so that the order of the plugins list
// does not matter and a dangling name is a configuration error.
type Resolver interface {
	Resolve(lookup func(name string) (Plugin, bool)) error
}

// PluginSetResolver is implemented by plugins that read another
// configured plugin found by its type rather than named (the multicluster
// scorers and their extractor): the loader calls ResolvePlugins once every
// plugin is built, with all of them.
type PluginSetResolver interface {
	ResolvePlugins(all []Plugin) error
}

// UnsupportedParameterError is a parameter of an upstream (GIE / llm-d)
// plugin that kvgate knows but does not implement: the plugin refuses it
// rather than ignore it.
type UnsupportedParameterError struct {
	// Param is the parameter's path ("kvEventsConfig.engineType").
	Param string
	// Reason says why, and what to do instead.
	Reason string
}

func (e *UnsupportedParameterError) Error() string {
	return fmt.Sprintf("parameters.%s is not supported by kvgate: %s", e.Param, e.Reason)
}

// RefuseSet returns an UnsupportedParameterError for the first of params
// (path → raw value) that is present and not null.
func RefuseSet(reason string, params map[string]json.RawMessage) error {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if v := bytes.TrimSpace(params[k]); len(v) > 0 && !bytes.Equal(v, []byte("null")) {
			return &UnsupportedParameterError{Param: k, Reason: reason}
		}
	}
	return nil
}

// LookupAs finds the plugin a parameter names and requires it to be a T,
// for Resolvers: param is the parameter that named it and what says what a
// T is ("a disaggregation decider"), both for the error.
func LookupAs[T any](lookup func(name string) (Plugin, bool), param, name, what string) (T, error) {
	var zero T
	p, ok := lookup(name)
	if !ok {
		return zero, fmt.Errorf("parameters.%s: %q is not a configured plugin", param, name)
	}
	t, ok := p.(T)
	if !ok {
		return zero, fmt.Errorf("parameters.%s: %q (type %s) is not %s", param, name, p.TypedName().Type, what)
	}
	return t, nil
}
