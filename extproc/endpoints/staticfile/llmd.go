package staticfile

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// MaxLLMDFileBytes is llm-d's bound on its endpoints file.
const MaxLLMDFileBytes = 1 << 20

// NamespaceLabel is the label an llm-d entry's namespace is kept in.
const NamespaceLabel = "namespace"

// llmdEntry is one endpoint of llm-d's file-discovery format.
type llmdEntry struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Address   string            `json:"address"`
	Port      json.RawMessage   `json:"port"`
	Labels    map[string]string `json:"labels"`
}

// ParseLLMD reads llm-d's file-discovery format (its no-Kubernetes
// deployment):
//
//	endpoints:
//	  - name: vllm-0
//	    namespace: default   # optional
//	    address: "10.0.0.1"  # an IPv4 address
//	    port: "8000"         # 1-65535, a string (a number is accepted too)
//	    labels: {llm-d.ai/role: decode}
//
// As in llm-d, an entry with a bad address or port is skipped, not fatal:
// skipped says which and why. Metrics are scraped at address:port. The
// namespace (default "default") is kept as the label "namespace". A file
// over 1 MiB, or one that is not this shape, is an error, and so is a kept
// set that fails endpoints.Validate (two entries of one name, say).
func ParseLLMD(data []byte) (specs []endpoints.Spec, skipped []error, err error) {
	return parseLLMD(data, false)
}

// ParseLLMDHosts is ParseLLMD for llm-d's multicluster-file-discovery: an
// address may also be a DNS name (a peer cluster's gateway) or an IPv6
// address, and the specs are marked Hostname.
func ParseLLMDHosts(data []byte) (specs []endpoints.Spec, skipped []error, err error) {
	return parseLLMD(data, true)
}

func parseLLMD(data []byte, hosts bool) (specs []endpoints.Spec, skipped []error, err error) {
	if len(data) > MaxLLMDFileBytes {
		return nil, nil, fmt.Errorf("file larger than %d bytes", MaxLLMDFileBytes)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, nil, fmt.Errorf("yaml: %w", err)
	}
	var f struct {
		Endpoints []llmdEntry `json:"endpoints"`
	}
	if err := json.Unmarshal(js, &f); err != nil {
		return nil, nil, fmt.Errorf("want a mapping with a list \"endpoints\": %w", err)
	}
	specs = make([]endpoints.Spec, 0, len(f.Endpoints))
	for i, e := range f.Endpoints {
		if ip := net.ParseIP(e.Address); !hosts && (ip == nil || ip.To4() == nil) {
			skipped = append(skipped, &endpoints.SpecError{Index: i, Name: e.Name, Field: "address", Err: fmt.Errorf("%q is not an IPv4 address", e.Address)})
			continue
		}
		port, err := llmdPort(e.Port)
		if err != nil {
			skipped = append(skipped, &endpoints.SpecError{Index: i, Name: e.Name, Field: "port", Err: err})
			continue
		}
		if hosts {
			if err := endpoints.ParseHostAddress(net.JoinHostPort(e.Address, strconv.Itoa(port))); err != nil {
				skipped = append(skipped, &endpoints.SpecError{Index: i, Name: e.Name, Field: "address", Err: err})
				continue
			}
		}
		ns := e.Namespace
		if ns == "" {
			ns = "default"
		}
		labels := make(map[string]string, len(e.Labels)+1)
		for k, v := range e.Labels {
			labels[k] = v
		}
		labels[NamespaceLabel] = ns
		specs = append(specs, endpoints.Spec{Name: e.Name, Address: net.JoinHostPort(e.Address, strconv.Itoa(port)), Labels: labels, Hostname: hosts})
	}
	if err := endpoints.Validate(specs); err != nil {
		return nil, skipped, err
	}
	return specs, skipped, nil
}

func llmdPort(raw json.RawMessage) (int, error) {
	var s string
	var n int
	switch {
	case json.Unmarshal(raw, &s) == nil:
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			return 0, fmt.Errorf("%q is not a port", s)
		}
	case json.Unmarshal(raw, &n) == nil:
	default:
		return 0, fmt.Errorf("%s is not a port", raw)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("%d is outside 1-65535", n)
	}
	return n, nil
}
