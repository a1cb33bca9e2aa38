package epp

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/kvevents"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
)

// llm-d's pod discovery (kvEventsConfig.podDiscoveryConfig) subscribes to
// each endpoint's own publisher on its IP; an endpoint's configured
// sources win, and without the llm-d layout nothing is derived.
// rank is the spec discovery makes for one data-parallel rank of a pod
// (kvEvents: its own source, "" for none).
func rank(pod string, r int, addr, kvEvents string) endpoints.Spec {
	return endpoints.Spec{Name: endpoints.RankName(pod, r), Address: addr, KVEvents: kvEvents,
		DataParallel: &endpoints.DataParallelRank{Server: pod, Rank: r}}
}

func TestKVEventSource(t *testing.T) {
	ep := func(spec endpoints.Spec) *endpoints.Endpoint { return endpoints.NewEndpoint(spec) }
	tests := []struct {
		name string
		ev   precise.KVEvents
		spec endpoints.Spec
		want kvevents.Source
	}{
		{"pod discovery", precise.KVEvents{SocketPort: 5556, ReplayPort: 5558}, endpoints.Spec{Name: "a", Address: "10.0.0.7:8000"},
			kvevents.Source{Events: "tcp://10.0.0.7:5556", Replay: "tcp://10.0.0.7:5558"}},
		{"IPv6", precise.KVEvents{SocketPort: 5557}, endpoints.Spec{Name: "a", Address: "[fd00::7]:8000"}, kvevents.Source{Events: "tcp://[fd00::7]:5557"}},
		{"endpoint's own source wins", precise.KVEvents{SocketPort: 5556}, endpoints.Spec{Name: "a", Address: "10.0.0.7:8000", KVEvents: "tcp://10.0.0.7:9999"},
			kvevents.Source{Events: "tcp://10.0.0.7:9999"}},
		{"no llm-d layout", precise.KVEvents{}, endpoints.Spec{Name: "a", Address: "10.0.0.7:8000"}, kvevents.Source{}},
		// vLLM's rank r publishes on the configured ports plus r.
		{"data-parallel rank", precise.KVEvents{SocketPort: 5557, ReplayPort: 5600}, rank("vllm-0", 2, "10.0.0.7:8002", ""),
			kvevents.Source{Events: "tcp://10.0.0.7:5559", Replay: "tcp://10.0.0.7:5602", Server: "vllm-0", Rank: 2}},
		{"data-parallel rank's own source", precise.KVEvents{SocketPort: 5557}, rank("vllm-0", 1, "10.0.0.7:8001", "tcp://10.0.0.7:9999"),
			kvevents.Source{Events: "tcp://10.0.0.7:9999", Server: "vllm-0", Rank: 1}},
		{"data-parallel rank beyond the last port", precise.KVEvents{SocketPort: 65535}, rank("vllm-0", 1, "10.0.0.7:8001", ""),
			kvevents.Source{Server: "vllm-0", Rank: 1}},
		// A one-port pod's name may end like a rank's: only its spec says.
		{"a pod named like a rank", precise.KVEvents{SocketPort: 5557}, endpoints.Spec{Name: endpoints.RankName("vllm", 1), Address: "10.0.0.7:8000"},
			kvevents.Source{Events: "tcp://10.0.0.7:5557"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Picker{built: &config.Built{KVEvents: tc.ev}, log: quiet}
			if got := p.kvEventSource(ep(tc.spec)); got != tc.want {
				t.Fatalf("source %+v, want %+v", got, tc.want)
			}
		})
	}
}
