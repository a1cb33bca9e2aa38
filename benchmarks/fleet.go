package benchmarks

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/sim/engine"
)

// parsePresets reads --presets, "name:count,name:count", into a preset per
// replica in the order given.
func parsePresets(spec string) ([]engine.Preset, error) {
	var out []engine.Preset
	for _, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		name, count, ok := strings.Cut(entry, ":")
		if !ok {
			return nil, fmt.Errorf("--presets entry %q: want name:count", entry)
		}
		p, found := engine.LookupPreset(name)
		if !found {
			return nil, fmt.Errorf("--presets entry %q: unknown preset %q (%s)", entry, name, presetNames())
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--presets entry %q: count must be a positive integer", entry)
		}
		if len(out)+n > 1<<16 {
			return nil, fmt.Errorf("--presets entry %q: too many replicas", entry)
		}
		for range n {
			out = append(out, p)
		}
	}
	return out, nil
}
