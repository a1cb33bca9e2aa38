package config

import (
	"fmt"

	"github.com/kvgate/kvgate/extproc/plugins/picker"
	"github.com/kvgate/kvgate/extproc/plugins/profilehandler"
	"github.com/kvgate/kvgate/extproc/saturation"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Built is a configuration turned into running parts.
type Built struct {
	Scheduler *scheduling.Scheduler
	// Plugins are all instantiated plugins in configuration order, with the
	// defaults added.
	Plugins []scheduling.Plugin
	// Hooks are the plugins implementing each request-lifecycle extension.
	PreRequest       []scheduling.PreRequest
	ResponseComplete []scheduling.ResponseComplete
	FirstToken       []scheduling.FirstToken
	EndpointsRemoved []scheduling.EndpointsRemoved
	Saturation       saturation.Config
	FeatureGates     map[string]bool
}

// Build instantiates the configuration's plugins from reg and assembles the
// scheduler, applying GIE's defaults: a profile without a picker gets a
// max-score-picker; a configuration without a profile handler gets a
// single-profile-handler; a configuration without profiles gets one profile
// "default" holding every filter, scorer and picker. observe, when not nil,
// receives every plugin call's duration.
func Build(c *Config, reg *scheduling.Registry, h *scheduling.Handle, observe scheduling.Observer) (*Built, error) {
	b := &Built{Saturation: saturation.Defaults(), FeatureGates: map[string]bool{}}
	for _, g := range c.FeatureGates {
		b.FeatureGates[g] = true
	}
	if c.SaturationDetector != nil {
		b.Saturation = fillSaturation(*c.SaturationDetector)
	}
	if err := b.Saturation.Validate(); err != nil {
		return nil, err
	}

	byName := map[string]scheduling.Plugin{}
	lookup := func(name string) (scheduling.Plugin, bool) { p, ok := byName[name]; return p, ok }
	hh := *h
	hh.Plugin = lookup
	add := func(where string, spec PluginSpec) (scheduling.Plugin, error) {
		name := spec.Name
		if name == "" {
			name = spec.Type
		}
		if spec.Type == "" {
			return nil, fmt.Errorf("%s: type is required", where)
		}
		if _, dup := byName[name]; dup {
			return nil, fmt.Errorf("%s: plugin name %q is used twice", where, name)
		}
		p, err := reg.Build(spec.Type, name, spec.Parameters, &hh)
		if err != nil {
			return nil, fmt.Errorf("%s (name %q, type %q): %w", where, name, spec.Type, err)
		}
		byName[name] = p
		b.Plugins = append(b.Plugins, p)
		return p, nil
	}
	for i, spec := range c.Plugins {
		if _, err := add(fmt.Sprintf("plugins[%d]", i), spec); err != nil {
			return nil, err
		}
	}

	var handler scheduling.ProfileHandler
	for _, p := range b.Plugins {
		if ph, ok := p.(scheduling.ProfileHandler); ok {
			if handler != nil {
				return nil, fmt.Errorf("plugins: more than one profile handler (%s and %s)", handler.TypedName(), ph.TypedName())
			}
			handler = ph
		}
	}

	specs := c.SchedulingProfiles
	if len(specs) == 0 {
		spec := ProfileSpec{Name: "default"}
		for _, p := range b.Plugins {
			switch p.(type) {
			case scheduling.Filter, scheduling.Scorer, scheduling.Picker:
				spec.Plugins = append(spec.Plugins, PluginRef{PluginRef: p.TypedName().Name})
			}
		}
		specs = []ProfileSpec{spec}
	}

	profiles := map[string]*scheduling.Profile{}
	names := make([]string, 0, len(specs))
	for i, ps := range specs {
		where := fmt.Sprintf("schedulingProfiles[%d]", i)
		if ps.Name == "" {
			return nil, fmt.Errorf("%s: name is required", where)
		}
		if _, dup := profiles[ps.Name]; dup {
			return nil, fmt.Errorf("%s: profile name %q is used twice", where, ps.Name)
		}
		prof, err := buildProfile(where, ps, byName)
		if err != nil {
			return nil, err
		}
		if prof.Picker == nil {
			p, err := add(where+" (default picker)", PluginSpec{Name: ps.Name + "-" + picker.MaxScoreType, Type: picker.MaxScoreType})
			if err != nil {
				return nil, err
			}
			prof.Picker = p.(scheduling.Picker)
		}
		profiles[ps.Name] = prof
		names = append(names, ps.Name)
	}

	if handler == nil {
		p, err := add("default profile handler", PluginSpec{Type: profilehandler.SingleType})
		if err != nil {
			return nil, err
		}
		handler = p.(scheduling.ProfileHandler)
	}
	if v, ok := handler.(scheduling.ProfileValidator); ok {
		if err := v.ValidateProfiles(names); err != nil {
			return nil, fmt.Errorf("schedulingProfiles: %w", err)
		}
	}

	var stages scheduling.Stages
	for _, p := range b.Plugins {
		if x, ok := p.(scheduling.PreRequest); ok {
			b.PreRequest = append(b.PreRequest, x)
		}
		if x, ok := p.(scheduling.ResponseComplete); ok {
			b.ResponseComplete = append(b.ResponseComplete, x)
		}
		if x, ok := p.(scheduling.EndpointsRemoved); ok {
			b.EndpointsRemoved = append(b.EndpointsRemoved, x)
		}
		if x, ok := p.(scheduling.FirstToken); ok {
			b.FirstToken = append(b.FirstToken, x)
		}
		if x, ok := p.(scheduling.DataProducer); ok {
			stages.Producers = append(stages.Producers, x)
		}
		if x, ok := p.(scheduling.Admitter); ok {
			stages.Admitters = append(stages.Admitters, x)
		}
	}
	ordered, err := scheduling.OrderProducers(stages.Producers)
	if err != nil {
		return nil, fmt.Errorf("plugins: %w", err)
	}
	stages.Producers = ordered
	b.Scheduler = scheduling.NewScheduler(handler, profiles, observe, stages)
	return b, nil
}

func buildProfile(where string, ps ProfileSpec, byName map[string]scheduling.Plugin) (*scheduling.Profile, error) {
	prof := &scheduling.Profile{Name: ps.Name}
	for j, ref := range ps.Plugins {
		at := fmt.Sprintf("%s.plugins[%d]", where, j)
		p, ok := byName[ref.PluginRef]
		if !ok {
			return nil, fmt.Errorf("%s.pluginRef: %q is not a configured plugin", at, ref.PluginRef)
		}
		used := false
		if f, ok := p.(scheduling.Filter); ok {
			prof.Filters = append(prof.Filters, f)
			used = true
		}
		if s, ok := p.(scheduling.Scorer); ok {
			w := 1.0
			if ref.Weight != nil {
				w = *ref.Weight
			}
			if w < 0 {
				return nil, fmt.Errorf("%s.weight: must not be negative, got %v", at, w)
			}
			prof.Scorers = append(prof.Scorers, scheduling.WeightedScorer{Scorer: s, Weight: w})
			used = true
		} else if ref.Weight != nil {
			return nil, fmt.Errorf("%s.weight: %q is not a scorer", at, ref.PluginRef)
		}
		if pk, ok := p.(scheduling.Picker); ok {
			if prof.Picker != nil {
				return nil, fmt.Errorf("%s: profile %q has a second picker %q", at, ps.Name, ref.PluginRef)
			}
			prof.Picker = pk
			used = true
		}
		switch p.(type) {
		case scheduling.DataProducer, scheduling.Admitter:
			// Bound by capability for every request; GIE's configs also
			// list them in a profile.
			used = true
		}
		if !used {
			return nil, fmt.Errorf("%s.pluginRef: %q (type %q) is not a filter, scorer or picker", at, ref.PluginRef, p.TypedName().Type)
		}
	}
	return prof, nil
}

// fillSaturation applies defaults to the fields a configuration left out.
func fillSaturation(c saturation.Config) saturation.Config {
	d := saturation.Defaults()
	if c.QueueDepthThreshold == 0 {
		c.QueueDepthThreshold = d.QueueDepthThreshold
	}
	if c.KVCacheUtilThreshold == 0 {
		c.KVCacheUtilThreshold = d.KVCacheUtilThreshold
	}
	if c.MetricsStalenessThreshold == 0 {
		c.MetricsStalenessThreshold = d.MetricsStalenessThreshold
	}
	return c
}
