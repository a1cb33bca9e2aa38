package k8s

import (
	"errors"
	"fmt"
	"math"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// objectiveGVKs are InferenceObjective's API versions: llm-d's group, where
// the API moved with the picker, and GIE's, where it began. Both are read,
// and an objective of llm-d's group wins over a namesake in GIE's. Their Go
// types are not in the GIE module version kvgate pins, so objectives are
// read as unstructured objects, which also keeps kvgate working with
// whatever later fields the CRDs grow.
var objectiveGVKs = []schema.GroupVersionKind{
	{Group: "llm-d.ai", Version: "v1alpha2", Kind: "InferenceObjective"},
	{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Kind: "InferenceObjective"},
}

// MaxObjectives bounds the priority table; a namespace with more objectives
// than this is misconfigured, and the extra ones (by name order) resolve to
// no priority.
const MaxObjectives = 10000

// objectivePriority reads one InferenceObjective. matches is false when its
// poolRef names another pool; an error means it is malformed. An objective
// without spec.priority has priority 0, as in the API's definition.
func objectivePriority(obj map[string]any, pool string) (name string, priority int, matches bool, err error) {
	name, _, err = unstructured.NestedString(obj, "metadata", "name")
	if err != nil {
		return "", 0, false, fmt.Errorf("metadata.name: %w", err)
	}
	if name == "" {
		return "", 0, false, errors.New("metadata.name is empty")
	}
	if ok, err := poolRefMatches(obj, pool); err != nil || !ok {
		return name, 0, false, err
	}

	v, found, err := unstructured.NestedFieldNoCopy(obj, "spec", "priority")
	if err != nil || !found || v == nil {
		return name, 0, true, nil
	}
	// JSON decoding gives int64 for integers; float64 only appears for
	// objects built by hand, and is accepted when integral.
	switch n := v.(type) {
	case int64:
		priority, err = intPriority(n)
	case float64:
		if n != math.Trunc(n) || math.IsInf(n, 0) || math.IsNaN(n) {
			return name, 0, true, fmt.Errorf("spec.priority %v is not an integer", n)
		}
		priority, err = intPriority(int64(n))
	default:
		return name, 0, true, fmt.Errorf("spec.priority has type %T, want integer", v)
	}
	if err != nil {
		return name, 0, true, err
	}
	return name, priority, true, nil
}

// intPriority keeps priorities within int32, the range every consumer of
// the value (metrics labels, flow-control bands) is built for.
func intPriority(n int64) (int, error) {
	if n < math.MinInt32 || n > math.MaxInt32 {
		return 0, fmt.Errorf("spec.priority %d out of the 32-bit range", n)
	}
	return int(n), nil
}

// poolRefMatches reports whether an object's spec.poolRef names the pool
// (an InferencePool of inference.networking.k8s.io, the defaults).
func poolRefMatches(obj map[string]any, pool string) (bool, error) {
	ref, found, err := unstructured.NestedMap(obj, "spec", "poolRef")
	if err != nil || !found {
		return false, fmt.Errorf("spec.poolRef: missing or not an object")
	}
	refName, _ := ref["name"].(string)
	group, _ := ref["group"].(string)
	kind, _ := ref["kind"].(string)
	return refName == pool && (group == "" || group == inferencev1.GroupName) && (kind == "" || kind == "InferencePool"), nil
}
