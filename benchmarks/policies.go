package benchmarks

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/extproc/config"
)

const header = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

// Policies are the built-in routing policies in their report order. Each is
// the EndpointPickerConfig a user would deploy for it.
var Policies = []cluster.Policy{
	{Name: "random", Config: []byte(header + "plugins:\n- type: random-picker\n")},
	{Name: "round-robin", Config: []byte(header + "plugins:\n- type: round-robin-picker\n")},
	{Name: "load", Config: []byte(header + `plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: max-score-picker
`)},
	{Name: "approx", Config: []byte(config.DefaultYAML)},
	// llm-d's precise prefix-cache routing profile: GIE's default with the
	// approximate scorer replaced by the KV-event-fed one, hashing blocks as
	// the simulated servers do.
	{Name: "precise", Config: []byte(header + `plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: precise-prefix-cache-scorer
  parameters:
    blockSize: ` + strconv.Itoa(cluster.DefaultBlockSize) + `
    hashSeed: "` + cluster.DefaultHashSeed + `"
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
`)},
	{Name: "oracle", Config: []byte(header + "plugins:\n- type: " + cluster.OracleType + "\n")},
}

// DefaultPolicies is every built-in policy.
func DefaultPolicies() string {
	names := make([]string, len(Policies))
	for i, p := range Policies {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}

// maxConfigBytes bounds a --config file.
const maxConfigBytes = 1 << 20

// selectPolicies resolves a comma-separated list of built-in names plus
// any configuration files, each named after its file.
func selectPolicies(list string, files []string) ([]cluster.Policy, error) {
	var out []cluster.Policy
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		found := false
		for _, p := range Policies {
			if p.Name == n {
				out, found = append(out, p), true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown policy %q (built-in: %s)", n, DefaultPolicies())
		}
		if seen[n] {
			return nil, fmt.Errorf("policy %q listed twice", n)
		}
		seen[n] = true
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("policy config: %w", err)
		}
		if st.Size() > maxConfigBytes {
			return nil, fmt.Errorf("policy config %s: larger than %d bytes", f, maxConfigBytes)
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("policy config: %w", err)
		}
		name := strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
		if seen[name] {
			return nil, fmt.Errorf("policy %q given twice", name)
		}
		seen[name] = true
		out = append(out, cluster.Policy{Name: name, Config: data})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no policies selected")
	}
	return out, nil
}
