package k8stest

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvgate/kvgate/internal/testutil"
)

// RequireEnv is the environment variable that turns a missing envtest into a
// test failure instead of a skip.
const RequireEnv = "KVGATE_REQUIRE_ENVTEST"

// ErrNoAssets means the envtest binaries are not installed.
var ErrNoAssets = errors.New("envtest binaries not found: run scripts/envtest.sh")

// Required reports whether tests must fail rather than skip without envtest.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// AssetsDir is where kube-apiserver and etcd are: $KUBEBUILDER_ASSETS when
// set, otherwise .cache/envtest/bin of the repository.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		root, err := testutil.FindRepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, ".cache", "envtest", "bin")
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("%w (%s missing in %s)", ErrNoAssets, bin, dir)
		}
	}
	return dir, nil
}

// ExtraCRDDir holds the CRDs scripts/envtest.sh copies from other projects'
// modules (InferenceObjective, ServiceMonitor, EnvoyExtensionPolicy, Istio).
func ExtraCRDDir() (string, error) {
	assets, err := AssetsDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(assets), "crds"), nil
}

// GIECRDDir is config/crd/bases of the gateway-api-inference-extension
// module version in go.mod, so the CRDs always match the Go types.
func GIECRDDir() (string, error) {
	root, err := testutil.FindRepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating the gateway-api-inference-extension module: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("GIE CRDs: %w", err)
	}
	return dir, nil
}

// Env is a running control plane.
type Env struct {
	env *envtest.Environment
	// Config connects as a cluster administrator.
	Config *rest.Config
}

// Start runs kube-apiserver and etcd and installs the GIE CRDs plus the
// given extra CRD files or folders (which must exist). It returns
// ErrNoAssets (wrapped) when the binaries are not installed.
func Start(extraCRDs ...string) (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	gie, err := GIECRDDir()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths:              append([]string{gie}, extraCRDs...),
			ErrorIfPathMissing: true,
		},
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest: %w", err)
	}
	return &Env{env: env, Config: cfg}, nil
}

// Stop shuts the control plane down.
func (e *Env) Stop() error { return e.env.Stop() }

// ServiceAccountConfig returns a config that impersonates a service
// account, so tests run with exactly the rights RBAC grants it.
func (e *Env) ServiceAccountConfig(namespace, name string) *rest.Config {
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	return cfg
}

// Suite is one test package's shared control plane.
type Suite struct {
	env  *Env
	skip string
}

// Main is the body of a test package's TestMain: it starts a control plane
// with the extra CRDs (none while fuzzing: every fuzz worker runs TestMain
// and none needs one), runs the tests, stops it, and returns the exit code.
// Without the envtest binaries the tests skip, or fail when Required.
func (s *Suite) Main(m *testing.M, extraCRDs ...string) int {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		s.skip = "fuzzing"
		return m.Run()
	}
	e, err := Start(extraCRDs...)
	switch {
	case errors.Is(err, ErrNoAssets) && !Required():
		s.skip = err.Error()
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return 1
	default:
		s.env = e
		defer func() {
			if err := e.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "stopping envtest:", err)
			}
		}()
	}
	return m.Run()
}

// Env is the running control plane; the test skips without one.
func (s *Suite) Env(tb testing.TB) *Env {
	tb.Helper()
	if s.env == nil {
		tb.Skip(s.skip)
	}
	return s.env
}

// WriteKubeconfig writes a kubeconfig file for a cluster administrator of
// the control plane, for processes the tests start (`kvgate epp
// --kubeconfig`, or $KUBECONFIG).
func (e *Env) WriteKubeconfig(path string) error {
	u, err := e.env.AddUser(envtest.User{Name: "kvgate-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("envtest user: %w", err)
	}
	data, err := u.KubeConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	return os.WriteFile(path, data, 0o600)
}
