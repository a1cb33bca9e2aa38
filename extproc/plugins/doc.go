// Package plugins is the home of the picker's built-in scheduling plugins,
// one sub-package each, registered by type name in plugins/all. Each plugin
// documents its parameters (the YAML `parameters` of an EndpointPickerConfig
// entry) beside its code.
package plugins
