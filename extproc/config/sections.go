package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/scrape"
	"github.com/kvgate/kvgate/extproc/parsers"
	"github.com/kvgate/kvgate/extproc/plugins/anthropicparser"
	"github.com/kvgate/kvgate/extproc/plugins/models"
	"github.com/kvgate/kvgate/extproc/plugins/openaiparser"
	"github.com/kvgate/kvgate/extproc/plugins/passthroughparser"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/plugins/vllmhttpparser"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Features kvgate does not implement yet, as UnsupportedError.Feature.
const (
	FeaturePD    = "P/D disaggregation"
	FeatureOther = "not implemented"
)

// UnsupportedError is a section, field, feature gate or plugin type of the
// GIE / llm-d format that kvgate does not implement yet. It is always an
// error: a configuration that asks for it must not load and then behave
// otherwise.
type UnsupportedError struct {
	// Where locates it in the configuration ("plugins[3]", "flowControl").
	Where string
	// Name is the plugin type, section or gate.
	Name string
	// Feature is the kind of thing missing, one of the Feature constants.
	Feature string
	// Hint says what to do instead, when kvgate has something.
	Hint string
}

func (e *UnsupportedError) Error() string {
	msg := fmt.Sprintf("%s: %q is not supported by kvgate (%s)", e.Where, e.Name, e.Feature)
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

// knownPluginTypes are upstream plugin types kvgate's registry lacks, with
// the feature they belong to, so that the error says why; a type in
// neither the registry nor this table is an unknown type.
var knownPluginTypes = map[string]UnsupportedError{}

// unknownType turns the registry's unknown-type error for typ into an
// UnsupportedError when typ is a known upstream plugin.
func unknownType(where, typ string, err error) error {
	var unknown *scheduling.UnknownTypeError
	if !errors.As(err, &unknown) {
		return err
	}
	if k, ok := knownPluginTypes[typ]; ok {
		k.Where, k.Name = where+".type", typ
		return &k
	}
	return err
}

// featureGates are the gates of the GIE / llm-d formats kvgate knows. A
// true value is a gate kvgate accepts: a feature it always has (so turning
// it on changes nothing) or one it builds when asked; a gate not listed, or
// listed false, is refused.
var featureGates = map[string]bool{
	// GIE's pluggable data layer: kvgate's data layer is always the
	// configured one.
	"dataLayer": true,
	// Data-producer plugins before scheduling: always on in kvgate.
	"prepareDataPlugins": true,
	// GIE v1.5: poll metrics with the older, pre-data-layer code. The
	// metrics polled are the same; kvgate has one scraper (llm-d removed
	// the gate).
	"enableLegacyMetrics": true,
	// The flow-control layer: built from the flowControl section when on
	// (flowcontrol.go).
	"flowControl": true,
}

func checkFeatureGates(gates []string) error {
	for i, g := range gates {
		on, known := featureGates[g]
		switch {
		case on:
		case known:
			return &UnsupportedError{Where: fmt.Sprintf("featureGates[%d]", i), Name: g, Feature: FeatureOther}
		default:
			return &UnsupportedError{Where: fmt.Sprintf("featureGates[%d]", i), Name: g, Feature: FeatureOther, Hint: "unknown feature gate"}
		}
	}
	return nil
}

// unsupportedSections refuses the sections and fields kvgate does not
// implement, under either name of the data layer's section.
func unsupportedSections(c *Config) error {
	for _, sec := range []struct {
		where string
		dl    *DataLayerSpec
	}{{"dataLayer", c.DataLayer}, {"data", c.Data}} {
		dl := sec.dl
		switch {
		case dl == nil:
		case dl.PeerDiscovery != nil:
			return &UnsupportedError{Where: sec.where + ".peerDiscovery", Name: dl.PeerDiscovery.PluginRef, Feature: FeatureOther}
		case dl.CrossReplicaSyncerPluginRef != "":
			return &UnsupportedError{Where: sec.where + ".crossReplicaSyncerPluginRef", Name: dl.CrossReplicaSyncerPluginRef, Feature: FeatureOther}
		case dl.CrossReplicaSyncInterval != "":
			return &UnsupportedError{Where: sec.where + ".crossReplicaSyncInterval", Name: "crossReplicaSyncInterval", Feature: FeatureOther}
		}
	}
	return nil
}

// The data layer's metrics plugins as the loader reads them.
type (
	metricsSource interface {
		ScrapeTarget() scrape.Target
		ScrapeInterval(base time.Duration) time.Duration
	}
	metricsExtractor interface {
		ScrapeEngines() *scrape.Engines
	}
	// poller is a data source that fetches from the endpoints itself
	// (models-data-source), into the extractors wired under it.
	poller interface {
		Poller
		scheduling.DataSource
		Connect(scheduling.DataExtractor)
	}
	// endpointDiscovery is a dataLayer.discovery plugin (file-discovery).
	endpointDiscovery interface {
		EndpointSource() endpoints.Source
	}
)

// Metrics is how the model servers' metrics are fetched and read: the data
// layer's metrics source and its extractor.
type Metrics struct {
	source    metricsSource
	extractor metricsExtractor
}

// Scrape returns base (the flags' scraper settings) with the data layer's
// target, interval and engine schemas applied.
func (m Metrics) Scrape(base scrape.Config) scrape.Config {
	if m.source != nil {
		base.Target = m.source.ScrapeTarget()
		base.Interval = m.source.ScrapeInterval(base.Interval)
	}
	if m.extractor != nil {
		base.Engines = m.extractor.ScrapeEngines()
	}
	return base
}

// dataLayer wires the configured sources and extractors. kvgate's scraper
// is the one data path, so there is at most one metrics source with one
// extractor; llm-d's defaults (a metrics source and a core extractor when
// none is configured) are the scraper's own defaults. A configuration that
// lists the metrics plugins without a dataLayer section gets them paired,
// as llm-d's chart relies on.
func (b *builder) dataLayer(c *Config) error {
	spec := c.DataLayer
	where := "dataLayer"
	if c.Data != nil {
		if spec != nil {
			return errors.New("data and dataLayer: give one (data is GIE's earlier name of dataLayer)")
		}
		spec, where = c.Data, "data"
	}
	if spec == nil {
		spec = &DataLayerSpec{}
	}
	wired := map[string]bool{}
	if d := spec.Discovery; d != nil {
		p, ok := b.byName[d.PluginRef]
		if !ok {
			return fmt.Errorf("%s.discovery.pluginRef: %q is not a configured plugin", where, d.PluginRef)
		}
		ed, ok := p.(endpointDiscovery)
		if !ok {
			return fmt.Errorf("%s.discovery.pluginRef: %q (type %s) is not an endpoint discovery", where, d.PluginRef, p.TypedName().Type)
		}
		b.out.Discovery, wired[d.PluginRef] = ed.EndpointSource(), true
	}
	for i, src := range spec.Sources {
		at := fmt.Sprintf("%s.sources[%d]", where, i)
		p, ok := b.byName[src.PluginRef]
		if !ok {
			return fmt.Errorf("%s.pluginRef: %q is not a configured plugin", at, src.PluginRef)
		}
		ds, ok := p.(scheduling.DataSource)
		if !ok {
			return fmt.Errorf("%s.pluginRef: %q (type %s) is not a data source", at, src.PluginRef, p.TypedName().Type)
		}
		if wired[src.PluginRef] {
			return fmt.Errorf("%s.pluginRef: source %q is listed twice", at, src.PluginRef)
		}
		wired[src.PluginRef] = true
		if pl, ok := p.(poller); ok {
			if len(src.Extractors) == 0 {
				return fmt.Errorf("%s: %q (type %s) has no extractors to fetch for", at, src.PluginRef, p.TypedName().Type)
			}
			b.out.Pollers = append(b.out.Pollers, pl)
		}
		ms, isMetrics := p.(metricsSource)
		if isMetrics {
			if b.out.Metrics.source != nil {
				return fmt.Errorf("%s: a second metrics source %q: kvgate scrapes each endpoint once", at, src.PluginRef)
			}
			b.out.Metrics.source = ms
		}
		for j, x := range src.Extractors {
			xat := fmt.Sprintf("%s.extractors[%d].pluginRef", at, j)
			xp, ok := b.byName[x.PluginRef]
			if !ok {
				return fmt.Errorf("%s: %q is not a configured plugin", xat, x.PluginRef)
			}
			ext, ok := xp.(scheduling.DataExtractor)
			if !ok {
				return fmt.Errorf("%s: %q (type %s) is not a data extractor", xat, x.PluginRef, xp.TypedName().Type)
			}
			if err := ext.AcceptsSource(ds); err != nil {
				return fmt.Errorf("%s: %w", xat, err)
			}
			if pl, ok := p.(poller); ok {
				pl.Connect(ext)
			}
			wired[x.PluginRef] = true
			if me, ok := xp.(metricsExtractor); ok && isMetrics {
				if b.out.Metrics.extractor != nil {
					return fmt.Errorf("%s: a second metrics extractor %q for one source", xat, x.PluginRef)
				}
				b.out.Metrics.extractor = me
			}
		}
	}
	// Metrics plugins configured but not wired above. (The endpoint
	// notifications the precise prefix plugins read flow whether wired or
	// not.)
	var looseSources, looseExtractors []scheduling.Plugin
	for _, p := range b.out.Plugins {
		if wired[p.TypedName().Name] {
			continue
		}
		switch p.(type) {
		case metricsSource:
			looseSources = append(looseSources, p)
		case metricsExtractor:
			looseExtractors = append(looseExtractors, p)
		case endpointDiscovery:
			return fmt.Errorf("plugins: %q (type %s) discovers endpoints but %s.discovery does not name it", p.TypedName().Name, p.TypedName().Type, where)
		case poller, *models.Extractor:
			return fmt.Errorf("plugins: %q (type %s) is a data-layer plugin not wired under %s.sources", p.TypedName().Name, p.TypedName().Type, where)
		}
	}
	if len(spec.Sources) == 0 && len(looseSources) <= 1 && len(looseExtractors) <= 1 {
		// llm-d's chart lists the metrics plugins without wiring them.
		if len(looseSources) == 1 {
			b.out.Metrics.source, looseSources = looseSources[0].(metricsSource), nil
		}
		if len(looseExtractors) == 1 {
			b.out.Metrics.extractor, looseExtractors = looseExtractors[0].(metricsExtractor), nil
		}
	}
	for _, p := range append(looseSources, looseExtractors...) {
		return fmt.Errorf("plugins: %q (type %s) is a data-layer plugin not wired under %s.sources", p.TypedName().Name, p.TypedName().Type, where)
	}
	if spec.InjectDefaults != nil && !*spec.InjectDefaults && b.out.Metrics.source == nil {
		return fmt.Errorf("%s.injectDefaults: false without a metrics-data-source: kvgate's picker routes on the model servers' metrics", where)
	}
	return nil
}

// defaultParsers are llm-d's request parsers when the configuration names
// none: the OpenAI, Anthropic and vLLM HTTP APIs, and passthrough for any
// other path.
var defaultParsers = []string{openaiparser.Type, anthropicparser.Type, vllmhttpparser.Type, passthroughparser.Type}

// parsers builds the request handler from the request parsers the
// configuration names, or llm-d's defaults. As in llm-d, a reference to a
// plugin that is not configured builds the parser type of that name with
// its defaults.
func (b *builder) parsers(c *Config) error {
	var refs []Ref
	where := "requestHandler.parsers"
	if c.RequestHandler != nil {
		refs = c.RequestHandler.Parsers
	}
	if c.Parser != nil {
		if len(refs) > 0 {
			return errors.New("parser and requestHandler.parsers: give one (parser is GIE's single-parser form)")
		}
		refs, where = []Ref{*c.Parser}, "parser"
	}
	if len(refs) == 0 {
		for _, typ := range defaultParsers {
			refs = append(refs, Ref{PluginRef: typ})
		}
		where = "default parsers"
	}
	ps := make([]parsers.Parser, 0, len(refs))
	for i, r := range refs {
		at := fmt.Sprintf("%s[%d].pluginRef", where, i)
		if where == "parser" {
			at = "parser.pluginRef"
		}
		p, ok := b.byName[r.PluginRef]
		if !ok {
			var err error
			if p, err = b.add(at, PluginSpec{Type: r.PluginRef}); err != nil {
				return fmt.Errorf("%s: %q is not a configured plugin nor a parser type: %w", at, r.PluginRef, err)
			}
		}
		parser, ok := p.(parsers.Parser)
		if !ok {
			return fmt.Errorf("%s: %q (type %s) is not a request parser", at, r.PluginRef, p.TypedName().Type)
		}
		ps = append(ps, parser)
	}
	set, err := parsers.NewSet(ps)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	b.out.Parsers = set
	return nil
}

// resolve lets plugins that name other plugins find them, now that all
// are built.
func (b *builder) resolve() error {
	for _, p := range b.out.Plugins {
		if r, ok := p.(scheduling.Resolver); ok {
			if err := r.Resolve(b.lookup); err != nil {
				return fmt.Errorf("plugins (name %q, type %q): %w", p.TypedName().Name, p.TypedName().Type, err)
			}
		}
		if r, ok := p.(scheduling.PluginSetResolver); ok {
			if err := r.ResolvePlugins(b.out.Plugins); err != nil {
				return fmt.Errorf("plugins (name %q, type %q): %w", p.TypedName().Name, p.TypedName().Type, err)
			}
		}
	}
	return nil
}

// kvEventSources is a precise prefix plugin configured in llm-d's layout.
type kvEventSources interface {
	KVEventSources() precise.KVEvents
}

// kvIndexLogger is a precise prefix plugin that asks for the KV index's
// metrics in the log.
type kvIndexLogger interface {
	KVIndexLogInterval() time.Duration
}

// kvEvents collects what the precise prefix plugins ask the picker for;
// two that ask for different sources are a conflict, since the picker has
// one KV index fed one way.
func (b *builder) kvEvents() error {
	var from scheduling.TypedName
	for _, p := range b.out.Plugins {
		if l, ok := p.(kvIndexLogger); ok {
			if d := l.KVIndexLogInterval(); d > 0 && (b.out.KVIndexLogInterval == 0 || d < b.out.KVIndexLogInterval) {
				b.out.KVIndexLogInterval = d
			}
		}
		k, ok := p.(kvEventSources)
		if !ok {
			continue
		}
		ev := k.KVEventSources()
		if ev == (precise.KVEvents{}) {
			continue
		}
		if b.out.KVEvents != (precise.KVEvents{}) && b.out.KVEvents != ev {
			return fmt.Errorf("plugins: %s and %s ask for different KV-event sources (%+v, %+v)", from, p.TypedName(), b.out.KVEvents, ev)
		}
		b.out.KVEvents, from = ev, p.TypedName()
	}
	return nil
}
