package staticfile

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

const example = `# two decode ranks and a prefill pod
endpoints:
  - name: pod-a
    address: 10.0.0.5:8000        # metrics at http://10.0.0.5:8000/metrics
    labels: {llm-d.ai/role: decode}
    kvEvents: tcp://10.0.0.5:5557
  - name: pod-b
    address: "[fd00::7]:8000"
    labels:
      llm-d.ai/role: prefill
      zone: "a"
    metricsURL: http://10.0.0.6:9090/metrics
  - name: pod-c-rank-1
    address: 10.0.0.8:8001
    nodeAddress: 192.168.0.7
    dataParallel: {server: pod-c, rank: 1}
`

func TestParse(t *testing.T) {
	got, err := Parse([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	want := []endpoints.Spec{
		{Name: "pod-a", Address: "10.0.0.5:8000", Labels: map[string]string{endpoints.RoleLabel: "decode"}, KVEvents: "tcp://10.0.0.5:5557"},
		{Name: "pod-b", Address: "[fd00::7]:8000", Labels: map[string]string{endpoints.RoleLabel: "prefill", "zone": "a"}, MetricsURL: "http://10.0.0.6:9090/metrics"},
		{Name: "pod-c-rank-1", Address: "10.0.0.8:8001", NodeAddress: "192.168.0.7", DataParallel: &endpoints.DataParallelRank{Server: "pod-c", Rank: 1}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse =\n%+v\nwant\n%+v", got, want)
	}
	empty, err := Parse([]byte("endpoints: []\n"))
	if err != nil || len(empty) != 0 {
		t.Errorf("empty pool: %v %v", empty, err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		index int    // -1: not about one entry
		field string // SpecError.Field
		is    error
		msg   string // substring of the message
	}{
		{"empty file", "", -1, "", nil, "want a mapping"},
		{"no endpoints key", "endpoint: []\n", -1, "", ErrUnknownField, `"endpoint"`},
		{"missing endpoints", "{}\n", -1, "", endpoints.ErrRequired, "endpoints"},
		{"endpoints not a list", "endpoints: {name: a}\n", -1, "", nil, "want a list"},
		{"not yaml", "endpoints: [\n", -1, "", nil, "yaml"},
		{"duplicate key", "endpoints:\n  - name: a\n    name: b\n    address: 10.0.0.1:1\n", -1, "", nil, "yaml"},
		{"unknown field", "endpoints:\n  - name: a\n    adress: 10.0.0.1:1\n", 0, "adress", ErrUnknownField, `"a"`},
		{"wrong case", "endpoints:\n  - name: a\n    Address: 10.0.0.1:1\n", 0, "Address", ErrUnknownField, ""},
		{"entry not a mapping", "endpoints:\n  - pod-a\n", 0, "(entry)", nil, ""},
		{"label not a string", "endpoints:\n  - name: a\n    address: 10.0.0.1:1\n    labels: {n: [1]}\n", 0, "labels", nil, ""},
		{"null address", "endpoints:\n  - name: a\n    address: null\n", 0, "address", nil, "null"},
		{"missing address", "endpoints:\n  - name: a\n", 0, "address", endpoints.ErrRequired, ""},
		{"hostname address", "endpoints:\n  - name: a\n    address: pod-a:8000\n", 0, "address", nil, "ip:port"},
		{"no port", "endpoints:\n  - name: ok\n    address: 10.0.0.1:1\n  - name: b\n    address: 10.0.0.2\n", 1, "address", nil, `"b"`},
		{"duplicate name", "endpoints:\n  - {name: a, address: 10.0.0.1:1}\n  - {name: a, address: 10.0.0.2:1}\n", 1, "name", endpoints.ErrDuplicate, "endpoints[0]"},
		{"duplicate address", "endpoints:\n  - {name: a, address: 10.0.0.1:1}\n  - {name: b, address: 10.0.0.1:1}\n", 1, "address", endpoints.ErrDuplicate, ""},
		{"bad kvEvents", "endpoints:\n  - {name: a, address: 10.0.0.1:1, kvEvents: 'ipc:///tmp/x'}\n", 0, "kvEvents", nil, "tcp"},
		{"bad metricsURL", "endpoints:\n  - {name: a, address: 10.0.0.1:1, metricsURL: '/metrics'}\n", 0, "metricsURL", nil, ""},
		{"dataParallel unknown key", "endpoints:\n  - {name: a, address: 10.0.0.1:1, dataParallel: {server: p, rank: 0, rnk: 1}}\n", 0, "dataParallel", ErrUnknownField, "rnk"},
		{"dataParallel without rank", "endpoints:\n  - {name: a, address: 10.0.0.1:1, dataParallel: {server: p}}\n", 0, "dataParallel", endpoints.ErrRequired, "rank"},
		{"dataParallel not a mapping", "endpoints:\n  - {name: a, address: 10.0.0.1:1, dataParallel: 1}\n", 0, "dataParallel", nil, "server and rank"},
		{"negative rank", "endpoints:\n  - {name: a, address: 10.0.0.1:1, dataParallel: {server: p, rank: -1}}\n", 0, "dataParallel", nil, "rank -1"},
		{"empty server", "endpoints:\n  - {name: a, address: 10.0.0.1:1, dataParallel: {server: '', rank: 0}}\n", 0, "dataParallel", nil, "want a server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.file))
			if err == nil {
				t.Fatal("accepted")
			}
			var se *endpoints.SpecError
			switch {
			case tt.index < 0 && errors.As(err, &se):
				t.Errorf("unexpected entry error %v", err)
			case tt.index >= 0 && !errors.As(err, &se):
				t.Errorf("err = %v, want a SpecError", err)
			case tt.index >= 0 && (se.Index != tt.index || se.Field != tt.field):
				t.Errorf("error names entry %d field %q, want %d %q: %v", se.Index, se.Field, tt.index, tt.field, err)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want errors.Is %v", err, tt.is)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err = %q, want it to mention %q", err, tt.msg)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(example))
	f.Add([]byte("endpoints: []\n"))
	f.Add([]byte("endpoints:\n  - {name: a, address: '[::1]:80', labels: {k: v}}\n"))
	f.Add([]byte("endpoints:\n  - name: a\n    address: 10.0.0.1:1\n    labels: &x {a: b}\n  - name: b\n    address: 10.0.0.2:1\n    labels: *x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		specs, err := Parse(data)
		if err != nil {
			return
		}
		if err := endpoints.Validate(specs); err != nil {
			t.Fatalf("Parse accepted an invalid set: %v", err)
		}
		// Whatever parses survives a write-out and re-read unchanged.
		// Spec's JSON tags are the file's keys.
		out, err := yaml.Marshal(map[string]any{"endpoints": specs})
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("re-reading %q: %v", out, err)
		}
		if len(again) != len(specs) {
			t.Fatalf("round trip changed the set")
		}
		for i := range specs {
			a, b := specs[i], again[i]
			if len(a.Labels) == 0 && len(b.Labels) == 0 {
				a.Labels, b.Labels = nil, nil
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("round trip: %+v became %+v", a, b)
			}
		}
	})
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, specs := range [][]endpoints.Spec{
		nil,
		{{Name: "sim-0", Address: "127.0.0.1:8001"}},
		{{Name: "a", Address: "10.0.0.5:8000", Labels: map[string]string{"llm-d.ai/role": "decode"},
			KVEvents: "tcp://10.0.0.5:5557", KVEventsReplay: "tcp://10.0.0.5:5558", MetricsURL: "http://10.0.0.5:9000/metrics"},
			{Name: "b", Address: "10.0.0.6:8000"},
			{Name: "c-rank-2", Address: "10.0.0.7:8002", NodeAddress: "192.168.0.7", DataParallel: &endpoints.DataParallelRank{Server: "c", Rank: 2}}},
	} {
		raw, err := Marshal(specs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Parse(raw)
		if err != nil {
			t.Fatalf("Parse(Marshal(%v)): %v\n%s", specs, err, raw)
		}
		if len(got) != len(specs) || (len(specs) > 0 && !reflect.DeepEqual(got, specs)) {
			t.Fatalf("round trip: got %+v, want %+v\n%s", got, specs, raw)
		}
	}
}
