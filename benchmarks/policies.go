package benchmarks

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/benchmarks/cluster"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/internal/kvhash"
)

// Policies are the built-in routing policies in their report order: the
// named policies of extproc/config (the precise one hashing blocks as the
// simulated servers do) and the bench-only oracle.
var Policies = builtinPolicies()

func builtinPolicies() []cluster.Policy {
	var out []cluster.Policy
	for _, name := range config.PolicyNames {
		raw, err := config.Policy(name, config.PolicyOptions{BlockSize: kvhash.DefaultBlockSize, HashSeed: kvhash.DefaultSeed})
		if err != nil {
			panic(err) // PolicyNames lists only names Policy knows
		}
		out = append(out, cluster.Policy{Name: name, Config: raw})
	}
	oracle, err := yaml.Marshal(config.Config{APIVersion: config.APIVersionGIE, Kind: config.Kind,
		Plugins: []config.PluginSpec{{Type: cluster.OracleType}}})
	if err != nil {
		panic(err) // a fixed document of plain fields
	}
	return append(out, cluster.Policy{Name: "oracle", Config: oracle})
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
