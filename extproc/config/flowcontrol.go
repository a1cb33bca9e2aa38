package config

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/duration"
)

// FlowControlGate is the feature gate that turns the flow-control layer on.
const FlowControlGate = "flowControl"

// FlowControlSpec is the EndpointPickerConfig `flowControl` section, with
// llm-d's field names.
type FlowControlSpec struct {
	MaxBytes                    *Quantity          `json:"maxBytes,omitempty"`
	MaxRequests                 *Quantity          `json:"maxRequests,omitempty"`
	DefaultRequestTTL           *duration.Duration `json:"defaultRequestTTL,omitempty"`
	NoEndpointRequestTTL        *duration.Duration `json:"noEndpointRequestTTL,omitempty"`
	DefaultPriorityBand         *PriorityBandSpec  `json:"defaultPriorityBand,omitempty"`
	DefaultNegativePriorityBand *PriorityBandSpec  `json:"defaultNegativePriorityBand,omitempty"`
	PriorityBands               []PriorityBandSpec `json:"priorityBands,omitempty"`
	UsageLimitPolicyPluginRef   string             `json:"usageLimitPolicyPluginRef,omitempty"`
	SaturationDetector          *PluginRefSpec     `json:"saturationDetector,omitempty"`
	EnableEviction              bool               `json:"enableEviction,omitempty"`
}

// PriorityBandSpec is one `priorityBands` entry (or a band template).
type PriorityBandSpec struct {
	Priority          *int      `json:"priority,omitempty"`
	MaxBytes          *Quantity `json:"maxBytes,omitempty"`
	MaxRequests       *Quantity `json:"maxRequests,omitempty"`
	FairnessPolicyRef string    `json:"fairnessPolicyRef,omitempty"`
	OrderingPolicyRef string    `json:"orderingPolicyRef,omitempty"`
}

// PluginRefSpec names a configured plugin.
type PluginRefSpec struct {
	PluginRef string `json:"pluginRef,omitempty"`
}

// Quantity is a Kubernetes quantity ("10Gi", "1k", "500") or a plain
// integer, as llm-d's maxBytes and maxRequests accept.
type Quantity int64

// UnmarshalJSON accepts a number or a quantity string.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if uq, err := strconv.Unquote(s); err == nil {
		s = uq
	}
	v, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("quantity %s: %w", string(b), err)
	}
	n, ok := v.AsInt64()
	if !ok || n < 0 {
		return fmt.Errorf("quantity %s must be a non-negative integer", string(b))
	}
	*q = Quantity(n)
	return nil
}

// ttl is a flowControl TTL field's value; "0s" is an explicit zero (no TTL).
func ttl(field string, d duration.Duration) (time.Duration, error) {
	if d < 0 {
		return 0, fmt.Errorf("flowControl.%s must not be negative, got %v", field, time.Duration(d))
	}
	return time.Duration(d), nil
}

// ParseFlowControl decodes a `flowControl` section strictly: a field it
// does not know is an error naming it.
func ParseFlowControl(raw json.RawMessage) (*FlowControlSpec, error) {
	var s FlowControlSpec
	if len(bytes.TrimSpace(raw)) == 0 {
		return &s, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("flowControl: %w", err)
	}
	return &s, nil
}

// FlowControl is a configuration's flow-control layer, built.
type FlowControl struct {
	Config flowcontrol.Config
	// Detector is the saturation detector, the director's shedding test
	// without flow control too.
	Detector flowcontrol.SaturationDetector
}

// flowControl builds the layer when the gate is on; otherwise it still
// decodes the section strictly (a typo is an error either way) and resolves
// a detector that saturationDetector.pluginRef names, which the director's
// shedding uses.
func (b *builder) flowControl(c *Config) error {
	if b.out.FeatureGates[FlowControlGate] {
		return b.buildFlowControl(c)
	}
	spec, err := ParseFlowControl(c.FlowControl)
	if err != nil {
		return err
	}
	b.out.FlowControlIgnored = len(bytes.TrimSpace(c.FlowControl)) > 0
	if c.SaturationDetector != nil && c.SaturationDetector.PluginRef != "" {
		d, _, err := b.detector(c, spec)
		if err != nil {
			return err
		}
		b.out.Detector = d
	}
	return nil
}

// buildFlowControl resolves the flowControl section against the built
// plugins. A reference names a configured plugin; a reference to a
// plugin type that is not configured builds one with default parameters,
// as llm-d auto-creates its defaults.
func (b *builder) buildFlowControl(c *Config) error {
	spec, err := ParseFlowControl(c.FlowControl)
	if err != nil {
		return err
	}
	det, detName, err := b.detector(c, spec)
	if err != nil {
		return err
	}
	fc := &FlowControl{Detector: det}
	b.out.Detector = det
	cfg := &fc.Config
	cfg.Detector, cfg.DetectorName = det, detName
	cfg.EnableEviction = spec.EnableEviction
	if spec.MaxBytes != nil {
		cfg.MaxBytes = int64(*spec.MaxBytes)
	}
	if spec.MaxRequests != nil {
		cfg.MaxRequests = int64(*spec.MaxRequests)
	}
	cfg.RequestTTL = flowcontrol.DefaultRequestTTL
	if spec.DefaultRequestTTL != nil {
		if cfg.RequestTTL, err = ttl("defaultRequestTTL", *spec.DefaultRequestTTL); err != nil {
			return err
		}
	}
	cfg.NoEndpointTTL = cfg.RequestTTL
	if spec.NoEndpointRequestTTL != nil {
		if cfg.NoEndpointTTL, err = ttl("noEndpointRequestTTL", *spec.NoEndpointRequestTTL); err != nil {
			return err
		}
	}
	ulRef := spec.UsageLimitPolicyPluginRef
	if ulRef == "" {
		ulRef = flowpolicy.StaticLimitType
	}
	if cfg.UsageLimit, err = resolve[flowcontrol.UsageLimitPolicy](b, "flowControl.usageLimitPolicyPluginRef", ulRef, "usage-limit policy"); err != nil {
		return err
	}
	var zero PriorityBandSpec
	def := zero
	if spec.DefaultPriorityBand != nil {
		def = *spec.DefaultPriorityBand
	}
	if cfg.DefaultBand, err = b.band("flowControl.defaultPriorityBand", def, zero); err != nil {
		return err
	}
	cfg.DefaultNegativeBand = cfg.DefaultBand
	if spec.DefaultNegativePriorityBand != nil {
		if cfg.DefaultNegativeBand, err = b.band("flowControl.defaultNegativePriorityBand", *spec.DefaultNegativePriorityBand, def); err != nil {
			return err
		}
	}
	for i, bs := range spec.PriorityBands {
		where := fmt.Sprintf("flowControl.priorityBands[%d]", i)
		if bs.Priority == nil {
			return fmt.Errorf("%s.priority is required", where)
		}
		bc, err := b.band(where, bs, zero)
		if err != nil {
			return err
		}
		bc.Priority = *bs.Priority
		cfg.Bands = append(cfg.Bands, bc)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("flowControl: %w", err)
	}
	b.out.FlowControl = fc
	return nil
}

// band builds a band's configuration; fields left out (or "0") take
// fallback's, then the system defaults.
func (b *builder) band(where string, s, fallback PriorityBandSpec) (flowcontrol.BandConfig, error) {
	var bc flowcontrol.BandConfig
	pick := func(q, f *Quantity) int64 {
		if q != nil && *q != 0 {
			return int64(*q)
		}
		if f != nil {
			return int64(*f)
		}
		return 0
	}
	bc.MaxBytes, bc.MaxRequests = pick(s.MaxBytes, fallback.MaxBytes), pick(s.MaxRequests, fallback.MaxRequests)
	ref := func(v, f, d string) string {
		switch {
		case v != "":
			return v
		case f != "":
			return f
		}
		return d
	}
	var err error
	if bc.Fairness, err = resolve[flowcontrol.FairnessPolicy](b, where+".fairnessPolicyRef", ref(s.FairnessPolicyRef, fallback.FairnessPolicyRef, flowpolicy.GlobalStrictType), "fairness policy"); err != nil {
		return bc, err
	}
	if bc.Ordering, err = resolve[flowcontrol.OrderingPolicy](b, where+".orderingPolicyRef", ref(s.OrderingPolicyRef, fallback.OrderingPolicyRef, flowpolicy.FCFSType), "ordering policy"); err != nil {
		return bc, err
	}
	return bc, nil
}

// detector is flowControl.saturationDetector's plugin, else the top-level
// saturationDetector's (its pluginRef, or a utilization-detector with its
// legacy thresholds), else a default utilization-detector.
func (b *builder) detector(c *Config, spec *FlowControlSpec) (flowcontrol.SaturationDetector, string, error) {
	if err := oneDetector(c.SaturationDetector, spec.SaturationDetector); err != nil {
		return nil, "", err
	}
	ref, where := "", ""
	switch {
	case spec.SaturationDetector != nil && spec.SaturationDetector.PluginRef != "":
		ref, where = spec.SaturationDetector.PluginRef, "flowControl.saturationDetector.pluginRef"
	case c.SaturationDetector != nil && c.SaturationDetector.PluginRef != "":
		ref, where = c.SaturationDetector.PluginRef, "saturationDetector.pluginRef"
	case c.SaturationDetector != nil:
		return flowpolicy.NewUtilizationFrom(flowpolicy.UtilizationType, b.out.Saturation, scheduling.NowOf(&b.handle)), flowpolicy.UtilizationType, nil
	default:
		ref, where = flowpolicy.UtilizationType, "saturationDetector"
	}
	d, err := resolve[flowcontrol.SaturationDetector](b, where, ref, "saturation detector")
	if err != nil {
		return nil, "", err
	}
	return d, d.(scheduling.Plugin).TypedName().Type, nil
}

// resolve finds the plugin ref names, or builds one of type ref with
// default parameters when no plugin has that name; it must implement T.
func resolve[T any](b *builder, where, ref, kind string) (T, error) {
	var zero T
	p, ok := b.byName[ref]
	if !ok {
		built, err := b.add(where+" (default)", PluginSpec{Type: ref})
		if err != nil {
			return zero, fmt.Errorf("%s: %q is neither a configured plugin nor a plugin type: %w", where, ref, err)
		}
		p = built
	}
	t, ok := p.(T)
	if !ok {
		return zero, fmt.Errorf("%s: %q (type %q) is not a %s", where, ref, p.TypedName().Type, kind)
	}
	return t, nil
}

// oneDetector refuses a configuration that names its saturation detector
// in ways of which only one can be used: two different plugins, or GIE's
// legacy thresholds beside a plugin (which has its own parameters).
func oneDetector(top *SaturationSpec, fc *PluginRefSpec) error {
	if top == nil {
		return nil
	}
	fcRef := ""
	if fc != nil {
		fcRef = fc.PluginRef
	}
	if fcRef != "" && top.PluginRef != "" && fcRef != top.PluginRef {
		return fmt.Errorf("flowControl.saturationDetector.pluginRef: %q and saturationDetector.pluginRef: %q name two detectors; the picker has one", fcRef, top.PluginRef)
	}
	ref := cmp.Or(fcRef, top.PluginRef)
	if ref == "" {
		return nil
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"queueDepthThreshold", top.QueueDepthThreshold != 0},
		{"kvCacheUtilThreshold", top.KVCacheUtilThreshold != 0},
		{"metricsStalenessThreshold", top.MetricsStalenessThreshold != 0},
	} {
		if f.set {
			return fmt.Errorf("saturationDetector.%s: a legacy threshold beside the detector plugin %q would be ignored; set it in that plugin's parameters", f.name, ref)
		}
	}
	return nil
}
