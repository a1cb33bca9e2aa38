package async

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// GateConfig is a gate_type with its gate_params, as queue entries and
// composite gates carry them.
type GateConfig struct {
	GateType   string         `json:"gate_type"`
	GateParams map[string]any `json:"gate_params,omitempty"`
}

// Gate types kvgate async implements. llm-d-async's redis, redis-quota,
// wait-on-refuse, endpoint-scrape and tier-priority-admission are refused
// by name.
const (
	GateConstant             = "constant"
	GateLocalMaxConcurrency  = "local-max-concurrency"
	GateComposite            = "composite"
	GatePrometheusSaturation = "prometheus-saturation"
	GatePrometheusBudget     = "prometheus-budget"
	GatePrometheusQuery      = "prometheus-query"
	// GatePickerSaturation is kvgate's direct read of the picker's pool
	// saturation: the effective stage of llm_d_epp_flow_control_pool_saturation
	// scraped from the picker's /metrics (no Prometheus in between), or, in
	// the benchmark, the picker's saturation detector itself.
	GatePickerSaturation = "picker-saturation"
)

// Metric names the gates query (the picker's and vLLM's).
const (
	MetricPoolSaturationGIE  = "inference_extension_flow_control_pool_saturation"
	MetricPoolSaturationLLMD = "llm_d_epp_flow_control_pool_saturation"
	MetricFlowQueueSize      = "inference_extension_flow_control_queue_size"
	MetricReadyPods          = "inference_pool_ready_pods"
	MetricPerPodQueueSize    = "inference_pool_per_pod_queue_size"
	MetricVLLMRunning        = "vllm:num_requests_running"
)

// Factory builds gates from their configurations.
type Factory struct {
	// PrometheusURL serves the prometheus-* gates (--prometheus-url).
	PrometheusURL string
	// CacheTTL caches each Prometheus source's answer (0: none).
	CacheTTL time.Duration
	HTTP     *http.Client
	Now      func() time.Time
	// PoolSaturation, when set, is picker-saturation's reading instead of
	// a scrape: the benchmark's in-process picker.
	PoolSaturation SourceFunc
	// Observer, when set, gives each metric gate its gauges by owner.
	Observer func(inferencePool string) GateObserver
}

// maxGateDepth bounds composite nesting.
const maxGateDepth = 8

// New builds the gate cfg describes; an empty type is the constant gate.
func (f *Factory) New(cfg GateConfig) (Gate, error) { return f.build(cfg, 0) }

func (f *Factory) build(cfg GateConfig, depth int) (Gate, error) {
	if depth > maxGateDepth {
		return nil, fmt.Errorf("composite gates nested deeper than %d", maxGateDepth)
	}
	p := params{typ: cfg.GateType, m: cfg.GateParams}
	var g Gate
	var err error
	switch cfg.GateType {
	case "", GateConstant:
		g = openGate{}
	case GateLocalMaxConcurrency:
		var limit int
		if limit, err = p.int("limit", 0); err == nil && limit <= 0 {
			err = fmt.Errorf("local-max-concurrency: limit must be a positive integer, got %d", limit)
		}
		if mode := p.str("gating_mode", "classifying"); err == nil && mode != "classifying" {
			err = fmt.Errorf("local-max-concurrency: gating_mode %q is not supported (kvgate refuses at capacity: \"classifying\")", mode)
		}
		g = NewLocalConcurrency(limit)
	case GateComposite:
		var inner []GateConfig
		if inner, err = p.gates("gates"); err != nil {
			break
		}
		c := make(Composite, 0, len(inner))
		for i, ic := range inner {
			ig, ierr := f.build(ic, depth+1)
			if ierr != nil {
				return nil, fmt.Errorf("composite gate %d (%s): %w", i, ic.GateType, ierr)
			}
			c = append(c, ig)
		}
		g = c
	case GatePrometheusSaturation:
		pool := p.str("pool", "")
		threshold, e1 := p.float("threshold", 0.8)
		fallback, e2 := p.float("fallback", 0)
		err = firstErr(f.needProm(cfg.GateType), e1, e2, p.need("pool", pool), p.unit("threshold", threshold), p.unit("fallback", fallback))
		labels := map[string]string{"inference_pool": pool}
		if ns := p.str("namespace", ""); ns != "" {
			labels["namespace"] = ns
		}
		src := f.prom("1 - " + promSelector(MetricPoolSaturationGIE, labels))
		g = f.metricGate(src, 1-threshold, 1-fallback, pool)
	case GatePrometheusBudget:
		pool := p.str("pool", "")
		maxC, e1 := p.float("max_concurrency", 100)
		baseline, e2 := p.float("baseline", 0.05)
		fallback, e3 := p.float("fallback", 0)
		err = firstErr(f.needProm(cfg.GateType), e1, e2, e3, p.need("pool", pool), p.unit("fallback", fallback))
		if err == nil && maxC <= 0 {
			err = fmt.Errorf("prometheus-budget: max_concurrency must be positive, got %g", maxC)
		}
		if err == nil && (baseline < 0 || baseline >= 1) {
			err = fmt.Errorf("prometheus-budget: baseline must be in [0, 1), got %g", baseline)
		}
		ns := p.str("namespace", "")
		with := func(m map[string]string) map[string]string {
			if ns != "" {
				m["namespace"] = ns
			}
			return m
		}
		pods := promSelector(MetricReadyPods, with(map[string]string{"name": pool}))
		mc := strconv.FormatFloat(maxC, 'g', -1, 64)
		// llm-d-async's cascade: the picker's flow-control queue, then its
		// per-pod queue gauge, then vLLM's running requests.
		src := Cascade{
			f.prom(fmt.Sprintf("1 - (sum by(inference_pool)(%s) / on() (%s * %s))", promSelector(MetricFlowQueueSize, with(map[string]string{"inference_pool": pool})), pods, mc)),
			f.prom(fmt.Sprintf("1 - (avg by(name)(%s) / %s)", promSelector(MetricPerPodQueueSize, with(map[string]string{"name": pool})), mc)),
			f.prom(fmt.Sprintf("1 - (sum(%s) / on() (%s * %s))", promSelector(MetricVLLMRunning, with(map[string]string{"inference_pool": pool})), pods, mc)),
		}
		g = f.metricGate(src, baseline, fallback, pool)
	case GatePrometheusQuery:
		q := p.str("query", "")
		fallback, e1 := p.float("fallback", 0)
		err = firstErr(f.needProm(cfg.GateType), e1, p.need("query", q), p.unit("fallback", fallback))
		g = f.metricGate(f.prom(q), 0, fallback, p.str("pool", ""))
	case GatePickerSaturation:
		pool := p.str("pool", "")
		threshold, e1 := p.float("threshold", 0.8)
		// As prometheus-saturation's, the fallback saturation is 0: the
		// picker exports the gauge only once flow control dispatched.
		fallback, e2 := p.float("fallback", 0)
		err = firstErr(e1, e2, p.unit("threshold", threshold), p.unit("fallback", fallback))
		var src Source = f.PoolSaturation
		if f.PoolSaturation == nil {
			u := p.str("url", "")
			if err == nil {
				err = p.need("url", u)
			}
			labels := map[string]string{"stage": "effective"}
			if pool != "" {
				labels["inference_pool"] = pool
			}
			src = &Scrape{URL: u, Metric: MetricPoolSaturationLLMD, Labels: labels, Client: f.HTTP}
		} else if u := p.str("url", ""); u != "" && err == nil {
			err = fmt.Errorf("picker-saturation: url %q given, but this gate reads the picker in process", u)
		}
		g = f.metricGate(oneMinus{src}, 1-threshold, 1-fallback, pool)
	case "redis", "redis-quota", "wait-on-refuse", "endpoint-scrape", "tier-priority-admission":
		return nil, fmt.Errorf("gate_type %q is not supported by kvgate async (supported: %s)", cfg.GateType, strings.Join(GateTypes(), ", "))
	default:
		return nil, fmt.Errorf("unknown gate_type %q (supported: %s)", cfg.GateType, strings.Join(GateTypes(), ", "))
	}
	if err == nil {
		err = p.unused()
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

// GateTypes lists the supported gate types.
func GateTypes() []string {
	return []string{GateComposite, GateConstant, GateLocalMaxConcurrency, GatePickerSaturation, GatePrometheusBudget, GatePrometheusQuery, GatePrometheusSaturation}
}

func (f *Factory) needProm(typ string) error {
	if f.PrometheusURL == "" {
		return fmt.Errorf("%s gate needs --prometheus-url", typ)
	}
	return nil
}

func (f *Factory) prom(q string) Source {
	var s Source = &PromQL{URL: f.PrometheusURL, Query: q, Client: f.HTTP}
	if f.CacheTTL > 0 {
		now := f.Now
		if now == nil {
			now = time.Now
		}
		s = &Cached{Source: s, TTL: f.CacheTTL, Now: now}
	}
	return s
}

func (f *Factory) metricGate(src Source, threshold, fallback float64, pool string) *MetricGate {
	g := &MetricGate{Source: src, Threshold: threshold, Fallback: fallback}
	if f.Observer != nil {
		g.Observer = f.Observer(pool)
	}
	return g
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// params reads gate_params the way llm-d-async writes them: numbers as
// JSON numbers or strings, nested gates as JSON or as a JSON string. It
// remembers what was read so that an unknown parameter is refused.
type params struct {
	typ  string
	m    map[string]any
	read map[string]bool
}

func (p *params) get(k string) (any, bool) {
	if p.read == nil {
		p.read = map[string]bool{}
	}
	p.read[k] = true
	v, ok := p.m[k]
	return v, ok && v != nil
}

func (p *params) str(k, def string) string {
	v, ok := p.get(k)
	if !ok {
		return def
	}
	switch x := v.(type) {
	case string:
		if x == "" {
			return def
		}
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	}
	return def
}

func (p *params) float(k string, def float64) (float64, error) {
	v, ok := p.get(k)
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case float64:
		return x, nil
	case int:
		return float64(x), nil
	case string:
		if x == "" {
			return def, nil
		}
		f, err := strconv.ParseFloat(x, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %s %q is not a number", p.typ, k, x)
		}
		return f, nil
	}
	return 0, fmt.Errorf("%s: %s must be a number, got %T", p.typ, k, v)
}

func (p *params) int(k string, def int) (int, error) {
	f, err := p.float(k, float64(def))
	if err != nil {
		return 0, err
	}
	if f != float64(int(f)) {
		return 0, fmt.Errorf("%s: %s must be an integer, got %g", p.typ, k, f)
	}
	return int(f), nil
}

func (p *params) gates(k string) ([]GateConfig, error) {
	v, ok := p.get(k)
	if !ok {
		return nil, fmt.Errorf("%s: gates (a JSON array of {gate_type, gate_params}) is required", p.typ)
	}
	var raw []byte
	if s, isStr := v.(string); isStr {
		raw = []byte(s)
	} else {
		raw, _ = json.Marshal(v)
	}
	var out []GateConfig
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%s: gates: %w", p.typ, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: gates is empty", p.typ)
	}
	return out, nil
}

func (p *params) need(k, v string) error {
	if v == "" {
		return fmt.Errorf("%s gate needs gate_params.%s", p.typ, k)
	}
	return nil
}

func (p *params) unit(k string, v float64) error {
	if v < 0 || v > 1 {
		return fmt.Errorf("%s: %s must be in [0, 1], got %g", p.typ, k, v)
	}
	return nil
}

// unused refuses parameters the gate does not read.
func (p *params) unused() error {
	var extra []string
	for k := range p.m {
		if !p.read[k] {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return fmt.Errorf("%s gate: unknown gate_params %s", p.typ, strings.Join(extra, ", "))
	}
	return nil
}
