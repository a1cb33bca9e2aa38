package epp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// maxObjectivesFile bounds an --objectives file's size and entries.
const (
	maxObjectivesFileBytes = 4 << 20
	maxObjectivesInFile    = 10000
)

// objectiveFile is the InferenceObjectives of a YAML file (--objectives):
// the priorities of a picker without Kubernetes discovery, read once at
// start.
type objectiveFile map[string]int

// Priority implements director.Objectives.
func (o objectiveFile) Priority(name string) (int, bool) {
	p, ok := o[name]
	return p, ok
}

type objectiveDoc struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Priority *int64 `json:"priority"`
		PoolRef  struct {
			Name string `json:"name"`
		} `json:"poolRef"`
	} `json:"spec"`
}

// loadObjectives reads the InferenceObjective documents of path (llm-d.ai
// or GIE's group, v1alpha2) whose poolRef names pool; others are skipped,
// as discovery skips objectives of other pools. An objective without
// spec.priority has priority 0.
func loadObjectives(path, pool string) (objectiveFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--objectives: %w", err)
	}
	if len(data) > maxObjectivesFileBytes {
		return nil, fmt.Errorf("--objectives %s: larger than %d bytes", path, maxObjectivesFileBytes)
	}
	out := objectiveFile{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for i := 0; ; i++ {
		var d objectiveDoc
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("--objectives %s: document %d: %w", path, i, err)
		}
		if d.Kind == "" && d.APIVersion == "" {
			continue // an empty document
		}
		switch {
		case d.Kind != "InferenceObjective":
			return nil, fmt.Errorf("--objectives %s: document %d: kind %q, want InferenceObjective", path, i, d.Kind)
		case d.APIVersion != "llm-d.ai/v1alpha2" && d.APIVersion != "inference.networking.x-k8s.io/v1alpha2":
			return nil, fmt.Errorf("--objectives %s: document %d: apiVersion %q, want llm-d.ai/v1alpha2 or inference.networking.x-k8s.io/v1alpha2", path, i, d.APIVersion)
		case d.Metadata.Name == "":
			return nil, fmt.Errorf("--objectives %s: document %d: metadata.name is required", path, i)
		case d.Spec.Priority != nil && (*d.Spec.Priority < math.MinInt32 || *d.Spec.Priority > math.MaxInt32):
			return nil, fmt.Errorf("--objectives %s: %s: spec.priority %d is not an int32", path, d.Metadata.Name, *d.Spec.Priority)
		}
		if d.Spec.PoolRef.Name != pool {
			continue
		}
		if len(out) >= maxObjectivesInFile {
			return nil, fmt.Errorf("--objectives %s: more than %d objectives", path, maxObjectivesInFile)
		}
		p := 0
		if d.Spec.Priority != nil {
			p = int(*d.Spec.Priority)
		}
		out[d.Metadata.Name] = p
	}
	return out, nil
}
