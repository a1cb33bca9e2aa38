package k8s

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// MaxTargetPorts is the most ports one pod may serve as separate ranks; it is
// the InferencePool API's own limit, applied to --endpoint-target-ports too.
const MaxTargetPorts = 8

// ErrInvalidOptions marks a configuration mistake (as opposed to a cluster
// that cannot be reached), so that a command line can exit with a usage
// error.
var ErrInvalidOptions = errors.New("invalid kubernetes discovery options")

// Options configures a Discovery. Exactly one of PoolName and
// EndpointSelector is set.
type Options struct {
	// PoolName is the InferencePool whose selector and target ports define
	// the endpoints.
	PoolName string
	// PoolNamespace is the namespace of the pool, its pods and its
	// objectives; empty means the namespace of the kubeconfig context, or the
	// pod's own namespace when running in a cluster.
	PoolNamespace string
	// EndpointSelector is a label selector (kubectl syntax, e.g.
	// "app=vllm,tier!=canary") used instead of a pool.
	EndpointSelector string
	// TargetPorts are the model-server ports of each selected pod; required
	// with EndpointSelector, not allowed with PoolName (the pool has them).
	TargetPorts []int
	// Kubeconfig is a kubeconfig file; empty means $KUBECONFIG (or
	// ~/.kube/config) when present, otherwise the in-cluster service account.
	Kubeconfig string
	// RestConfig, when set, is used instead of Kubeconfig.
	RestConfig *rest.Config
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// validate checks the options that do not need a cluster and returns the
// static target of selector mode (the zero target in pool mode).
func (o *Options) validate() (target, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOptions, fmt.Sprintf(format, args...))
	}
	switch {
	case o.PoolName == "" && o.EndpointSelector == "":
		return target{}, invalid("one of pool name or endpoint selector is required")
	case o.PoolName != "" && o.EndpointSelector != "":
		return target{}, invalid("pool name and endpoint selector are mutually exclusive")
	case o.PoolName != "" && len(o.TargetPorts) > 0:
		return target{}, invalid("target ports come from the InferencePool; set them only with an endpoint selector")
	case o.PoolName != "":
		return target{}, nil
	}
	sel, err := labels.Parse(o.EndpointSelector)
	if err != nil {
		return target{}, invalid("endpoint selector %q: %v", o.EndpointSelector, err)
	}
	if sel.Empty() {
		// An empty selector matches every pod in the namespace, which is
		// never what a pool of model servers means.
		return target{}, invalid("endpoint selector %q selects every pod", o.EndpointSelector)
	}
	ports, err := checkPorts(o.TargetPorts)
	if err != nil {
		return target{}, invalid("endpoint target ports: %v", err)
	}
	return target{selector: sel, ports: ports}, nil
}

// checkPorts validates a target port list: 1 to MaxTargetPorts ports, each
// 1-65535, no repeats (a repeat would give two ranks one address).
func checkPorts(ports []int) ([]int, error) {
	if len(ports) == 0 {
		return nil, errors.New("at least one port is required")
	}
	if len(ports) > MaxTargetPorts {
		return nil, fmt.Errorf("%d ports, at most %d allowed", len(ports), MaxTargetPorts)
	}
	for i, p := range ports {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("port %d out of range 1-65535", p)
		}
		if slices.Contains(ports[:i], p) {
			return nil, fmt.Errorf("port %d listed twice", p)
		}
	}
	return slices.Clone(ports), nil
}

// restConfig resolves the API server connection and the default namespace.
func (o *Options) restConfig() (*rest.Config, string, error) {
	if o.RestConfig != nil {
		ns := o.PoolNamespace
		if ns == "" {
			ns = "default"
		}
		return rest.CopyConfig(o.RestConfig), ns, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	// The deferred loader falls back to the in-cluster service account when
	// no kubeconfig is found, for both the config and the namespace.
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client config: %w", err)
	}
	ns := o.PoolNamespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, "", fmt.Errorf("kubernetes namespace: %w", err)
		}
	}
	return cfg, ns, nil
}

// ClientConfig resolves the API server connection and namespace as
// discovery does (kubeconfig file, $KUBECONFIG, ~/.kube/config, else the
// in-cluster service account), for the picker's other Kubernetes clients:
// leader election and the metrics endpoint's token reviews.
func ClientConfig(kubeconfig, namespace string) (*rest.Config, string, error) {
	o := Options{Kubeconfig: kubeconfig, PoolNamespace: namespace}
	return o.restConfig()
}
