package config

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/extproc/saturation"
)

// Accepted apiVersion and kind values: every API version the GIE and llm-d
// pickers' files use (one schema, renamed as the API moved from GIE to
// llm-d-router).
const (
	Kind              = "EndpointPickerConfig"
	APIVersionGIE     = "inference.networking.x-k8s.io/v1alpha1"
	APIVersionGIEOld  = "config.x-k8s.io/v1alpha1"
	APIVersionLLM     = "llm-d.ai/v1alpha1"
	APIVersionLLMNext = "llm-d.ai/v1"
	// APIVersionGIEApix is the group GIE v1.5's plugin READMEs use.
	APIVersionGIEApix = "config.apix.gateway-api-inference-extension.sigs.k8s.io/v1alpha1"
)

// APIVersions lists the accepted apiVersion values.
var APIVersions = []string{APIVersionLLM, APIVersionLLMNext, APIVersionGIE, APIVersionGIEOld, APIVersionGIEApix}

// Config is an EndpointPickerConfig document.
type Config struct {
	APIVersion         string        `json:"apiVersion"`
	Kind               string        `json:"kind"`
	Plugins            []PluginSpec  `json:"plugins,omitempty"`
	SchedulingProfiles []ProfileSpec `json:"schedulingProfiles,omitempty"`
	// Metadata is a Kubernetes-style object name some llm-d documents
	// carry; it changes nothing.
	Metadata           *Metadata       `json:"metadata,omitempty"`
	SaturationDetector *SaturationSpec `json:"saturationDetector,omitempty"`
	FeatureGates       []string        `json:"featureGates,omitempty"`
	// DataLayer wires data sources to extractors (llm-d); Data is GIE's
	// earlier name of the same section.
	DataLayer *DataLayerSpec `json:"dataLayer,omitempty"`
	Data      *DataLayerSpec `json:"data,omitempty"`
	// RequestHandler lists the request parsers (llm-d); Parser is GIE's
	// single-parser form.
	RequestHandler *RequestHandlerSpec `json:"requestHandler,omitempty"`
	Parser         *Ref                `json:"parser,omitempty"`
	// FlowControl is refused until flow control is implemented (Build
	// names it): it is kept raw only to say so.
	FlowControl json.RawMessage `json:"flowControl,omitempty"`
}

// Metadata is an EndpointPickerConfig's optional object metadata.
type Metadata struct {
	Name string `json:"name,omitempty"`
}

// SaturationSpec is the saturationDetector section: GIE's thresholds, or
// llm-d's pluginRef to a saturation-detector plugin (see flowcontrol.go).
type SaturationSpec struct {
	saturation.Config
	PluginRef string `json:"pluginRef,omitempty"`
}

// Ref names a configured plugin.
type Ref struct {
	PluginRef string `json:"pluginRef"`
}

// DataLayerSpec is the dataLayer section.
type DataLayerSpec struct {
	// InjectDefaults false means no metrics source is added when none is
	// configured (default true).
	InjectDefaults *bool            `json:"injectDefaults,omitempty"`
	Sources        []DataSourceSpec `json:"sources,omitempty"`
	// Discovery names the endpoint discovery plugin (file-discovery).
	// PeerDiscovery and the cross-replica fields are llm-d's; Build
	// refuses them by name until kvgate implements them.
	Discovery                   *Ref   `json:"discovery,omitempty"`
	PeerDiscovery               *Ref   `json:"peerDiscovery,omitempty"`
	CrossReplicaSyncerPluginRef string `json:"crossReplicaSyncerPluginRef,omitempty"`
	CrossReplicaSyncInterval    string `json:"crossReplicaSyncInterval,omitempty"`
}

// DataSourceSpec wires one data source to the extractors reading it.
type DataSourceSpec struct {
	PluginRef  string `json:"pluginRef"`
	Extractors []Ref  `json:"extractors,omitempty"`
}

// RequestHandlerSpec is the requestHandler section.
type RequestHandlerSpec struct {
	Parsers []Ref `json:"parsers,omitempty"`
}

// PluginSpec instantiates one plugin.
type PluginSpec struct {
	// Name defaults to Type.
	Name       string          `json:"name,omitempty"`
	Type       string          `json:"type"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// ProfileSpec is one scheduling profile.
type ProfileSpec struct {
	Name    string      `json:"name"`
	Plugins []PluginRef `json:"plugins"`
}

// PluginRef places a configured plugin in a profile.
type PluginRef struct {
	PluginRef string `json:"pluginRef"`
	// Weight applies to scorers; omitted means 1.
	Weight *float64 `json:"weight,omitempty"`
}

// DefaultYAML is the configuration used when none is given: GIE's default
// profile.
const DefaultYAML = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
`

// Parse decodes a configuration document strictly: unknown fields are
// errors. An empty document yields the default configuration.
func Parse(data []byte) (*Config, error) {
	if strings.TrimSpace(string(data)) == "" {
		data = []byte(DefaultYAML)
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("EndpointPickerConfig: %w", err)
	}
	if c.Kind != Kind {
		return nil, fmt.Errorf("EndpointPickerConfig: kind must be %q, got %q", Kind, c.Kind)
	}
	if !slices.Contains(APIVersions, c.APIVersion) {
		return nil, fmt.Errorf("EndpointPickerConfig: apiVersion must be one of %s, got %q", strings.Join(APIVersions, ", "), c.APIVersion)
	}
	return &c, nil
}

// Load reads and parses a configuration file; an empty path yields the
// default configuration.
func Load(path string) (*Config, error) {
	if path == "" {
		return Parse(nil)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading picker config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
