package staticfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// MaxFileBytes bounds the file; a pool description is kilobytes.
const MaxFileBytes = 16 << 20

// ErrUnknownField is wrapped by errors about misspelled or unsupported keys.
var ErrUnknownField = errors.New("unknown field")

// The file's keys. Matching is exact: encoding/json's case-insensitive
// matching would accept "Address" silently, which a strict format must not.
var entryFields = []string{"name", "address", "labels", "kvEvents", "kvEventsReplay", "metricsURL", "nodeAddress", "dataParallel"}

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
	var top map[string]json.RawMessage
	if err := decode(js, &top); err != nil {
		return nil, fmt.Errorf("top level: want a mapping with key \"endpoints\": %w", err)
	}
	for k := range top {
		if k != "endpoints" {
			return nil, fmt.Errorf("top level: %w %q", ErrUnknownField, k)
		}
	}
	rawList, ok := top["endpoints"]
	if !ok {
		return nil, fmt.Errorf("top level: endpoints: %w", endpoints.ErrRequired)
	}
	var list []json.RawMessage
	if err := decode(rawList, &list); err != nil {
		return nil, fmt.Errorf("endpoints: want a list: %w", err)
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
	var fields map[string]json.RawMessage
	if err := decode(raw, &fields); err != nil || fields == nil {
		return &endpoints.SpecError{Field: "(entry)", Err: errors.New("want a mapping")}
	}
	// Read the name first so that every later error can carry it.
	_ = decode(fields["name"], &s.Name)
	for _, k := range sortedKeys(fields) {
		var dst any
		switch k {
		case "name":
			dst = &s.Name
		case "address":
			dst = &s.Address
		case "labels":
			dst = &s.Labels
		case "kvEvents":
			dst = &s.KVEvents
		case "kvEventsReplay":
			dst = &s.KVEventsReplay
		case "metricsURL":
			dst = &s.MetricsURL
		case "nodeAddress":
			dst = &s.NodeAddress
		case "dataParallel":
			dp, err := parseDataParallel(fields[k])
			if err != nil {
				return &endpoints.SpecError{Name: s.Name, Field: k, Err: err}
			}
			s.DataParallel = dp
			continue
		default:
			return &endpoints.SpecError{Name: s.Name, Field: k,
				Err: fmt.Errorf("%w (want one of %v)", ErrUnknownField, entryFields)}
		}
		if err := decode(fields[k], dst); err != nil {
			return &endpoints.SpecError{Name: s.Name, Field: k, Err: err}
		}
	}
	return nil
}

// parseDataParallel reads an entry's data-parallel placement, {server,
// rank}, both required, nothing else.
func parseDataParallel(raw json.RawMessage) (*endpoints.DataParallelRank, error) {
	var fields map[string]json.RawMessage
	if err := decode(raw, &fields); err != nil || fields == nil {
		return nil, errors.New("want a mapping with server and rank")
	}
	dp := &endpoints.DataParallelRank{}
	for _, k := range sortedKeys(fields) {
		var dst any
		switch k {
		case "server":
			dst = &dp.Server
		case "rank":
			dst = &dp.Rank
		default:
			return nil, fmt.Errorf("%w %q (want server, rank)", ErrUnknownField, k)
		}
		if err := decode(fields[k], dst); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
	}
	if _, ok := fields["server"]; !ok {
		return nil, fmt.Errorf("server: %w", endpoints.ErrRequired)
	}
	if _, ok := fields["rank"]; !ok {
		return nil, fmt.Errorf("rank: %w", endpoints.ErrRequired)
	}
	return dp, nil
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

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
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
