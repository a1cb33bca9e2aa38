package config

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/extproc/saturation"
)

// Accepted apiVersion and kind values.
const (
	Kind          = "EndpointPickerConfig"
	APIVersionGIE = "inference.networking.x-k8s.io/v1alpha1"
	APIVersionLLM = "llm-d.ai/v1alpha1"
)

// Config is an EndpointPickerConfig document.
type Config struct {
	APIVersion         string             `json:"apiVersion"`
	Kind               string             `json:"kind"`
	Plugins            []PluginSpec       `json:"plugins,omitempty"`
	SchedulingProfiles []ProfileSpec      `json:"schedulingProfiles,omitempty"`
	SaturationDetector *saturation.Config `json:"saturationDetector,omitempty"`
	FeatureGates       []string           `json:"featureGates,omitempty"`
	// FlowControl, Data and Parser are sections of the GIE format that this
	// picker accepts so that existing files load; their contents are kept
	// for the components that interpret them.
	FlowControl json.RawMessage `json:"flowControl,omitempty"`
	Data        json.RawMessage `json:"data,omitempty"`
	Parser      json.RawMessage `json:"parser,omitempty"`
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
	if c.APIVersion != APIVersionGIE && c.APIVersion != APIVersionLLM {
		return nil, fmt.Errorf("EndpointPickerConfig: apiVersion must be %q or %q, got %q", APIVersionGIE, APIVersionLLM, c.APIVersion)
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
