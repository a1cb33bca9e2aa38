// Package filediscovery is llm-d's file-discovery: endpoint discovery
// without Kubernetes, from a file in llm-d's format (name, namespace, an
// IPv4 address, port, labels; see staticfile.ParseLLMD), named by
// dataLayer.discovery. With watchFile the file is watched and every edit
// applied (editors' renames and ConfigMap symlink swaps included; an edit
// that empties the pool, or an unreadable one, keeps the previous set);
// without it the file is read once at start. A missing or malformed file
// at start stops the picker. It replaces the picker's other discovery
// (--endpoints, Kubernetes).
//
// multicluster-file-discovery, llm-d's variant for a picker whose endpoints
// are peer clusters, reads the same file but an address may also be a DNS
// name (a cluster's gateway) or an IPv6 address; the picker then answers
// with host:port, which the gateway in front must resolve. The labels
// metricsAddress and metricsPort name a cluster's metrics host apart from
// its address (multicluster-metrics-data-source reads them).
//
// Parameters:
//
//	path: string     the endpoints file (required)
//	watchFile: bool  apply edits to the file (default false)
package filediscovery

import (
	"encoding/json"
	"errors"
	"log/slog"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registered plugin types.
const (
	Type             = "file-discovery"
	MultiClusterType = "multicluster-file-discovery"
)

// Params are the plugin's parameters.
type Params struct {
	Path      string `json:"path"`
	WatchFile bool   `json:"watchFile"`
}

// Discovery implements file-discovery.
type Discovery struct {
	scheduling.Named
	src *staticfile.File
}

// New is the plugin factory.
func New(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	return NewOf(Type, false)(name, raw, h)
}

// NewMultiCluster is multicluster-file-discovery's factory.
func NewMultiCluster(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	return NewOf(MultiClusterType, true)(name, raw, h)
}

// NewOf is the factory of a plugin of type typ with file-discovery's
// parameters; with hosts, addresses may be DNS names
// (staticfile.ParseLLMDHosts: multicluster-file-discovery).
func NewOf(typ string, hosts bool) scheduling.Factory {
	return func(name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
		return build(typ, hosts, name, raw, h)
	}
}

func build(typ string, hosts bool, name string, raw json.RawMessage, h *scheduling.Handle) (scheduling.Plugin, error) {
	var p Params
	if err := scheduling.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Path == "" {
		return nil, errors.New("parameters.path is required")
	}
	var log *slog.Logger
	if h != nil {
		log = h.Log
	}
	return &Discovery{Named: scheduling.NewNamed(typ, name),
		src: &staticfile.File{Path: p.Path, LLMD: true, Hosts: hosts, NoWatch: !p.WatchFile, Logger: log}}, nil
}

// EndpointSource is the discovered membership, for the picker's datastore.
func (d *Discovery) EndpointSource() endpoints.Source { return d.src }
