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

// Type is the registered plugin type.
const Type = "file-discovery"

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
	return &Discovery{Named: scheduling.NewNamed(Type, name),
		src: &staticfile.File{Path: p.Path, LLMD: true, NoWatch: !p.WatchFile, Logger: log}}, nil
}

// EndpointSource is the discovered membership, for the picker's datastore.
func (d *Discovery) EndpointSource() endpoints.Source { return d.src }
