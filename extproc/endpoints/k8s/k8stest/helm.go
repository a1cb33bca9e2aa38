package k8stest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kvgate/kvgate/internal/testutil"
)

// Helm finds the helm binary the chart tests render with: $HELM, the one
// scripts/envtest.sh builds, or one on $PATH. Without one the test fails
// when envtest is required and is skipped otherwise.
func Helm(tb testing.TB) string {
	tb.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	if assets, err := AssetsDir(); err == nil {
		if h := filepath.Join(assets, "helm"); exists(h) {
			return h
		}
	} else if root, err := testutil.FindRepoRoot(); err == nil {
		if h := filepath.Join(root, ".cache", "envtest", "bin", "helm"); exists(h) {
			return h
		}
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	if Required() {
		tb.Fatal("helm not found: run scripts/envtest.sh")
	}
	tb.Skip("helm not found: run scripts/envtest.sh")
	return ""
}

// DecodeObjects decodes rendered YAML documents (helm template's output)
// into objects, skipping empty ones.
func DecodeObjects(out []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decoding rendered YAML: %w", err)
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}
