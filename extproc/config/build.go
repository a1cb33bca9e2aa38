package config

import (
	"context"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/parsers"

	"github.com/kvgate/kvgate/extproc/plugins/picker"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/plugins/profilehandler"
	"github.com/kvgate/kvgate/extproc/saturation"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Poller is a data source that fetches from the endpoints itself: Poll
// runs until ctx ends, every interval (rounded to a multiple of base).
type Poller interface {
	Poll(ctx context.Context, ds *endpoints.Datastore, base time.Duration) error
}

// Built is a configuration turned into running parts.
type Built struct {
	Scheduler *scheduling.Scheduler
	// Plugins are all instantiated plugins in configuration order, with the
	// defaults added.
	Plugins []scheduling.Plugin
	// Hooks are the plugins implementing each request-lifecycle extension.
	RequestHeader    []scheduling.RequestHeader
	ResponseHeader   []scheduling.ResponseHeader
	ResponseMetadata []scheduling.ResponseMetadata
	PreRequest       []scheduling.PreRequest
	ResponseComplete []scheduling.ResponseComplete
	FirstToken       []scheduling.FirstToken
	Hold             []scheduling.Holder
	EndpointsRemoved []scheduling.EndpointsRemoved
	Saturation       saturation.Config
	FeatureGates     map[string]bool
	// Discovery is the endpoint membership dataLayer.discovery names
	// (file-discovery); nil: the picker's flags choose.
	Discovery endpoints.Source
	// Parsers is the request handler: the configured request parsers, or
	// llm-d's defaults.
	Parsers *parsers.Set
	// Pollers are the data sources that fetch from the endpoints
	// themselves (models-data-source): the picker runs Poll on each.
	Pollers []Poller
	// Metrics is the data layer's metrics source and extractor, applied
	// to the scraper with Metrics.Scrape.
	Metrics Metrics
	// KVEvents is where a precise prefix plugin configured in llm-d's
	// layout wants KV events from (zero: the flags and endpoint files
	// say).
	KVEvents precise.KVEvents
	// KVIndexLogInterval is how often the picker logs the KV index's
	// metrics (llm-d's metricsLoggingInterval; the shortest a precise
	// plugin asks for); 0 for never.
	KVIndexLogInterval time.Duration
	// FlowControl is the flow-control layer, nil unless the flowControl
	// feature gate is on; FlowControlIgnored reports a flowControl section
	// given without the gate (llm-d loads and ignores it; the picker says so).
	FlowControl        *FlowControl
	FlowControlIgnored bool
	// Detector is the saturation detector a saturationDetector.pluginRef
	// (or flowControl.saturationDetector) names; nil for the legacy
	// thresholds.
	Detector flowcontrol.SaturationDetector
}

// Build instantiates the configuration's plugins from reg and assembles the
// scheduler, applying GIE's defaults: a profile without a picker gets a
// max-score-picker; a configuration without a profile handler gets a
// single-profile-handler; a configuration without profiles gets one profile
// "default" holding every filter, scorer and picker. observe, when not nil,
// receives every plugin call's duration.
func Build(c *Config, reg *scheduling.Registry, h *scheduling.Handle, observe scheduling.Observer) (*Built, error) {
	b := &builder{reg: reg, byName: map[string]scheduling.Plugin{}}
	if err := b.settings(c); err != nil {
		return nil, err
	}
	b.handle = *h
	b.handle.Plugin = b.lookup
	if err := unsupportedSections(c); err != nil {
		return nil, err
	}
	for i, spec := range c.Plugins {
		if _, err := b.add(fmt.Sprintf("plugins[%d]", i), spec); err != nil {
			return nil, err
		}
	}
	if err := b.resolve(); err != nil {
		return nil, err
	}
	if err := b.dataLayer(c); err != nil {
		return nil, err
	}
	if err := b.parsers(c); err != nil {
		return nil, err
	}
	if err := b.kvEvents(); err != nil {
		return nil, err
	}
	// Only configured plugins can be handlers; look before the defaults
	// below are added.
	handler, err := b.configuredHandler()
	if err != nil {
		return nil, err
	}
	profiles, names, err := b.profiles(c.SchedulingProfiles)
	if err != nil {
		return nil, err
	}
	if handler, err = b.handlerFor(handler, names); err != nil {
		return nil, err
	}
	if err := b.flowControl(c); err != nil {
		return nil, err
	}
	stages, err := b.out.collectHooks()
	if err != nil {
		return nil, err
	}
	b.out.Scheduler = scheduling.NewScheduler(handler, profiles, observe, stages)
	return &b.out, nil
}

// builder holds what Build's steps share: the plugins built so far by name,
// and the handle every factory gets, whose Plugin looks them up.
type builder struct {
	reg    *scheduling.Registry
	handle scheduling.Handle
	byName map[string]scheduling.Plugin
	out    Built
}

func (b *builder) lookup(name string) (scheduling.Plugin, bool) {
	p, ok := b.byName[name]
	return p, ok
}

// settings applies the feature gates and the saturation detector's
// configuration over its defaults.
func (b *builder) settings(c *Config) error {
	b.out.Saturation = saturation.Defaults()
	b.out.FeatureGates = map[string]bool{}
	if err := checkFeatureGates(c.FeatureGates); err != nil {
		return err
	}
	for _, g := range c.FeatureGates {
		b.out.FeatureGates[g] = true
	}
	if c.SaturationDetector != nil {
		b.out.Saturation = fillSaturation(c.SaturationDetector.Config)
	}
	return b.out.Saturation.Validate()
}

// add builds one plugin; where locates it in the configuration for errors.
func (b *builder) add(where string, spec PluginSpec) (scheduling.Plugin, error) {
	name := spec.Name
	if name == "" {
		name = spec.Type
	}
	if spec.Type == "" {
		return nil, fmt.Errorf("%s: type is required", where)
	}
	if _, dup := b.byName[name]; dup {
		return nil, fmt.Errorf("%s: plugin name %q is used twice", where, name)
	}
	p, err := b.reg.Build(spec.Type, name, spec.Parameters, &b.handle)
	if err != nil {
		return nil, fmt.Errorf("%s (name %q, type %q): %w", where, name, spec.Type, unknownType(where, spec.Type, err))
	}
	b.byName[name] = p
	b.out.Plugins = append(b.out.Plugins, p)
	return p, nil
}

// configuredHandler returns the one profile handler among the plugins; nil
// if there is none.
func (b *builder) configuredHandler() (scheduling.ProfileHandler, error) {
	var handler scheduling.ProfileHandler
	for _, p := range b.out.Plugins {
		if ph, ok := p.(scheduling.ProfileHandler); ok {
			if handler != nil {
				return nil, fmt.Errorf("plugins: more than one profile handler (%s and %s)", handler.TypedName(), ph.TypedName())
			}
			handler = ph
		}
	}
	return handler, nil
}

// profiles builds the scheduling profiles, or the default one when the
// configuration has none, giving a max-score-picker to each profile
// without a picker. names are the profiles in configuration order.
func (b *builder) profiles(specs []ProfileSpec) (map[string]*scheduling.Profile, []string, error) {
	if len(specs) == 0 {
		specs = []ProfileSpec{defaultProfile(b.out.Plugins)}
	}
	profiles := map[string]*scheduling.Profile{}
	names := make([]string, 0, len(specs))
	for i, ps := range specs {
		where := fmt.Sprintf("schedulingProfiles[%d]", i)
		if ps.Name == "" {
			return nil, nil, fmt.Errorf("%s: name is required", where)
		}
		if _, dup := profiles[ps.Name]; dup {
			return nil, nil, fmt.Errorf("%s: profile name %q is used twice", where, ps.Name)
		}
		prof, err := buildProfile(where, ps, b.byName)
		if err != nil {
			return nil, nil, err
		}
		if prof.Picker == nil {
			p, err := b.add(where+" (default picker)", PluginSpec{Name: ps.Name + "-" + picker.MaxScoreType, Type: picker.MaxScoreType})
			if err != nil {
				return nil, nil, err
			}
			prof.Picker = p.(scheduling.Picker)
		}
		profiles[ps.Name] = prof
		names = append(names, ps.Name)
	}
	return profiles, names, nil
}

// defaultProfile is GIE's profile "default": every filter, scorer and
// picker, in configuration order.
func defaultProfile(plugins []scheduling.Plugin) ProfileSpec {
	spec := ProfileSpec{Name: "default"}
	for _, p := range plugins {
		switch p.(type) {
		case scheduling.Filter, scheduling.Scorer, scheduling.Picker:
			spec.Plugins = append(spec.Plugins, PluginRef{PluginRef: p.TypedName().Name})
		}
	}
	return spec
}

// handlerFor returns handler, or a single-profile-handler when there is
// none, once it accepts the profiles' names.
func (b *builder) handlerFor(handler scheduling.ProfileHandler, names []string) (scheduling.ProfileHandler, error) {
	if handler == nil {
		p, err := b.add("default profile handler", PluginSpec{Type: profilehandler.SingleType})
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
	return handler, nil
}

// collectHooks lists the plugins implementing each lifecycle extension and
// the stages that run before the profiles, producers in dependency order.
func (b *Built) collectHooks() (scheduling.Stages, error) {
	b.RequestHeader = ofKind[scheduling.RequestHeader](b.Plugins)
	b.ResponseHeader = ofKind[scheduling.ResponseHeader](b.Plugins)
	b.ResponseMetadata = ofKind[scheduling.ResponseMetadata](b.Plugins)
	b.PreRequest = ofKind[scheduling.PreRequest](b.Plugins)
	b.ResponseComplete = ofKind[scheduling.ResponseComplete](b.Plugins)
	b.EndpointsRemoved = ofKind[scheduling.EndpointsRemoved](b.Plugins)
	b.FirstToken = ofKind[scheduling.FirstToken](b.Plugins)
	b.Hold = ofKind[scheduling.Holder](b.Plugins)
	stages := scheduling.Stages{
		Producers: ofKind[scheduling.DataProducer](b.Plugins),
		Admitters: ofKind[scheduling.Admitter](b.Plugins),
		Screeners: ofKind[scheduling.Screener](b.Plugins),
	}
	ordered, err := scheduling.OrderProducers(stages.Producers)
	if err != nil {
		return stages, fmt.Errorf("plugins: %w", err)
	}
	stages.Producers = ordered
	return stages, nil
}

// ofKind is the plugins implementing T, in order.
func ofKind[T any](ps []scheduling.Plugin) []T {
	var out []T
	for _, p := range ps {
		if x, ok := p.(T); ok {
			out = append(out, x)
		}
	}
	return out
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
		case scheduling.DataProducer, scheduling.Admitter, scheduling.RequestHeader, scheduling.ResponseHeader, scheduling.ResponseMetadata, scheduling.RequestParser:
			// Bound by capability for every request (a parser by the
			// request handler); GIE's configs also list them in a
			// profile.
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
