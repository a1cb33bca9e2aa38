package staticfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// MaxFileBytes bounds the file; a pool description is kilobytes.
const MaxFileBytes = 16 << 20

// ErrUnknownField is wrapped by errors about misspelled or unsupported keys.
var ErrUnknownField = errors.New("unknown field")

// Parse reads a static endpoints file:
//
//	endpoints:
//	  - name: pod-a
//	    address: 10.0.0.5:8000
//	    labels: {llm-d.ai/role: decode}
//	    kvEvents: tcp://10.0.0.5:5557   # optional
//	    kvEventsReplay: tcp://10.0.0.5:5558  # optional
//	    metricsURL: http://...          # optional
//	    nodeAddress: 192.168.0.7        # optional
//	    dataParallel: {server: pod-a, rank: 1}  # optional
//
// Unknown or duplicate keys, values of the wrong type, and every check of
// endpoints.Validate are errors; errors about an entry are
// *endpoints.SpecError naming its index, name and field.
func Parse(data []byte) ([]endpoints.Spec, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("file larger than %d bytes", MaxFileBytes)
	}
	// YAMLToJSONStrict rejects duplicate keys, which plain YAML decoding
	// would resolve silently to the last one.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	var list []json.RawMessage
	if k, err := decodeStrict(js, []key{{name: "endpoints", required: true, decode: into(&list)}}); err != nil {
		switch {
		case errors.Is(err, errNotMapping):
			return nil, fmt.Errorf("top level: want a mapping with key \"endpoints\": %w", err)
		case k == "endpoints" && !errors.Is(err, endpoints.ErrRequired):
			return nil, fmt.Errorf("endpoints: want a list: %w", err)
		}
		return nil, fmt.Errorf("top level: %s: %w", k, err)
	}
	specs := make([]endpoints.Spec, len(list))
	for i, raw := range list {
		if err := parseEntry(raw, &specs[i]); err != nil {
			err.Index = i
			return nil, err
		}
	}
	if err := endpoints.Validate(specs); err != nil {
		return nil, err
	}
	return specs, nil
}

func parseEntry(raw json.RawMessage, s *endpoints.Spec) *endpoints.SpecError {
	// name first, so that every later error can carry it.
	k, err := decodeStrict(raw, []key{
		{name: "name", decode: into(&s.Name)},
		{name: "address", decode: into(&s.Address)},
		{name: "labels", decode: into(&s.Labels)},
		{name: "kvEvents", decode: into(&s.KVEvents)},
		{name: "kvEventsReplay", decode: into(&s.KVEventsReplay)},
		{name: "metricsURL", decode: into(&s.MetricsURL)},
		{name: "nodeAddress", decode: into(&s.NodeAddress)},
		{name: "dataParallel", decode: func(raw json.RawMessage) (err error) {
			s.DataParallel, err = parseDataParallel(raw)
			return err
		}},
	})
	switch {
	case errors.Is(err, errNotMapping):
		return &endpoints.SpecError{Field: "(entry)", Err: err}
	case err != nil:
		return &endpoints.SpecError{Name: s.Name, Field: k, Err: err}
	}
	return nil
}

// parseDataParallel reads an entry's data-parallel placement, {server,
// rank}, both required, nothing else.
func parseDataParallel(raw json.RawMessage) (*endpoints.DataParallelRank, error) {
	dp := &endpoints.DataParallelRank{}
	k, err := decodeStrict(raw, []key{
		{name: "server", required: true, decode: into(&dp.Server)},
		{name: "rank", required: true, decode: into(&dp.Rank)},
	})
	switch {
	case errors.Is(err, errNotMapping):
		// Not wrapped: the entry's own decodeStrict would take it for its
		// entry not being a mapping.
		return nil, errors.New("want a mapping with server and rank")
	case err != nil:
		return nil, fmt.Errorf("%s: %w", k, err)
	}
	return dp, nil
}

// errNotMapping is returned by decodeStrict for a value that is not a
// mapping (null included).
var errNotMapping = errors.New("want a mapping")

// key is one key a strict mapping may hold.
type key struct {
	name     string
	required bool
	decode   func(json.RawMessage) error
}

func into(dst any) func(json.RawMessage) error {
	return func(raw json.RawMessage) error { return decode(raw, dst) }
}

// decodeStrict decodes the mapping raw by keys, in their order, then refuses
// a key not among them (the first in sorted order, so that the error is the
// same on every run), then a required key missing. Matching is exact: encoding/json's
// case-insensitive matching would accept "Address" silently, which a strict
// format must not. It returns the key an error is about.
func decodeStrict(raw json.RawMessage, keys []key) (string, error) {
	var fields map[string]json.RawMessage
	if err := decode(raw, &fields); err != nil || fields == nil {
		return "", errNotMapping
	}
	for _, k := range keys {
		if v, ok := fields[k.name]; ok {
			if err := k.decode(v); err != nil {
				return k.name, err
			}
		}
	}
	unknown := slices.Sorted(maps.Keys(fields))
	unknown = slices.DeleteFunc(unknown, func(name string) bool {
		return slices.ContainsFunc(keys, func(k key) bool { return k.name == name })
	})
	if len(unknown) > 0 {
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = k.name
		}
		return unknown[0], fmt.Errorf("%w %q (want one of %v)", ErrUnknownField, unknown[0], names)
	}
	for _, k := range keys {
		if _, ok := fields[k.name]; k.required && !ok {
			return k.name, endpoints.ErrRequired
		}
	}
	return "", nil
}

// decode unmarshals one JSON value, refusing null where a value is due.
func decode(raw json.RawMessage, dst any) error {
	if raw == nil {
		return nil
	}
	if bytes.Equal(raw, []byte("null")) {
		return errors.New("null value")
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("want %s, got %s", te.Type, te.Value)
		}
		return err
	}
	return nil
}

// file is the document Parse reads.
type file struct {
	Endpoints []endpoints.Spec `json:"endpoints"`
}

// Marshal writes specs as a file Parse reads back to the same specs.
func Marshal(specs []endpoints.Spec) ([]byte, error) {
	if specs == nil {
		specs = []endpoints.Spec{} // "endpoints: []": Parse refuses null
	}
	return yaml.Marshal(file{Endpoints: specs})
}
