// Package config loads an EndpointPickerConfig (the GIE / llm-d YAML format)
// and builds the scheduler and request-lifecycle hooks it describes from a
// plugin registry. Files written for the GIE or llm-d pickers load
// unchanged; unknown plugin types and parameters are errors that name the
// offending entry, never silent skips.
package config
