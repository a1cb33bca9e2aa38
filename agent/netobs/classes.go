package netobs

import (
	"fmt"
	"strconv"
	"strings"
)

// Class is a named flow class: the TCP ports its servers listen on.
type Class struct {
	Name   string
	Ranges []PortRange
}

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ Lo, Hi uint16 }

// NIXLClass is the class of the agent's own NIXL transfer timings.
const NIXLClass = "kv_nixl"

// DefaultClasses are the ports of a standard deployment: vLLM's
// NixlConnector side channel (VLLM_NIXL_SIDE_CHANNEL_PORT 5600, one port
// per rank), UCX's TCP transport when UCX_TCP_PORT_RANGE puts it in
// 20000-20999 (UCX picks ephemeral ports otherwise), the picker's ports
// model servers and Envoy talk to (ext_proc 9002, KV events 5557) and the
// model servers' HTTP port (8000).
func DefaultClasses() []Class {
	return []Class{
		{Name: "nixl_side_channel", Ranges: []PortRange{{5600, 5663}}},
		{Name: "kv_ucx_tcp", Ranges: []PortRange{{20000, 20999}}},
		{Name: "picker", Ranges: []PortRange{{9002, 9002}, {5557, 5557}}},
		{Name: "model_ingress", Ranges: []PortRange{{8000, 8000}}},
	}
}

// maxClasses bounds the class label; 255 also keeps ids in a byte.
const maxClasses = 32

// ParseClass reads "name=port[-port][,port[-port]...]".
func ParseClass(s string) (Class, error) {
	name, spec, ok := strings.Cut(s, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" || spec == "" {
		return Class{}, fmt.Errorf("flow class %q: want name=port[-port][,...]", s)
	}
	if !validName(name) {
		return Class{}, fmt.Errorf("flow class %q: name must be [a-z0-9_]", name)
	}
	if name == NIXLClass {
		return Class{}, fmt.Errorf("flow class %q is reserved for NIXL transfer timings", name)
	}
	c := Class{Name: name}
	for part := range strings.SplitSeq(spec, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		l, err := parsePort(lo)
		if err != nil {
			return Class{}, fmt.Errorf("flow class %q: %w", name, err)
		}
		h := l
		if isRange {
			if h, err = parsePort(hi); err != nil {
				return Class{}, fmt.Errorf("flow class %q: %w", name, err)
			}
		}
		if h < l {
			return Class{}, fmt.Errorf("flow class %q: range %d-%d is empty", name, l, h)
		}
		c.Ranges = append(c.Ranges, PortRange{l, h})
	}
	return c, nil
}

func parsePort(s string) (uint16, error) {
	p, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("port %q: want 1-65535", s)
	}
	return uint16(p), nil
}

func validName(s string) bool {
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

// portTable maps each port to its class id (index+1, 0: none). The
// earlier class wins where ranges overlap; duplicate names are refused.
func portTable(classes []Class) ([]uint32, error) {
	if len(classes) == 0 {
		return nil, fmt.Errorf("no flow classes: nothing to track")
	}
	if len(classes) > maxClasses {
		return nil, fmt.Errorf("%d flow classes, at most %d", len(classes), maxClasses)
	}
	seen := map[string]bool{}
	t := make([]uint32, 1<<16)
	for i, c := range classes {
		if seen[c.Name] {
			return nil, fmt.Errorf("flow class %q given twice", c.Name)
		}
		seen[c.Name] = true
		for _, r := range c.Ranges {
			for p := uint32(r.Lo); p <= uint32(r.Hi); p++ {
				if t[p] == 0 {
					t[p] = uint32(i + 1)
				}
			}
		}
	}
	return t, nil
}
