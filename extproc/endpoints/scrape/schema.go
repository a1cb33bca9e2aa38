package scrape

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/internal/vllm"
)

// Selector picks the samples of one metric: its name and the label values
// they must carry, written as llm-d's metric specs are:
// `name` or `name{label=value,label="value"}`.
type Selector struct {
	Name   string
	Labels map[string]string
}

// ParseSelector reads a metric spec; an empty spec is the zero Selector
// (the metric is not read).
func ParseSelector(spec string) (Selector, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return Selector{}, nil
	}
	name, rest, hasLabels := strings.Cut(spec, "{")
	name = strings.TrimSpace(name)
	if name == "" {
		return Selector{}, fmt.Errorf("metric spec %q: no metric name", spec)
	}
	for i := 0; i < len(name); i++ {
		if !isLabelNameByte(name[i], i == 0) && name[i] != ':' {
			return Selector{}, fmt.Errorf("metric spec %q: bad metric name", spec)
		}
	}
	s := Selector{Name: name}
	if !hasLabels {
		return s, nil
	}
	body, ok := strings.CutSuffix(strings.TrimSpace(rest), "}")
	if !ok {
		return Selector{}, fmt.Errorf("metric spec %q: unterminated label set", spec)
	}
	s.Labels = map[string]string{}
	for pair := range strings.SplitSeq(body, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return Selector{}, fmt.Errorf("metric spec %q: want label=value, got %q", spec, pair)
		}
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		s.Labels[k] = v
	}
	return s, nil
}

func (s Selector) String() string {
	if len(s.Labels) == 0 {
		return s.Name
	}
	var b strings.Builder
	b.WriteString(s.Name + "{")
	for i, k := range slices.Sorted(maps.Keys(s.Labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + strconv.Quote(s.Labels[k]))
	}
	b.WriteByte('}')
	return b.String()
}

// Schema names the series of one inference engine's /metrics page that
// hold what the picker routes on (llm-d's engineConfigs of the
// core-metrics-extractor). Zero selectors are not read.
type Schema struct {
	Queue, Running, KVUsage Selector
	// LoRA is vLLM's lora_requests_info shape (max_lora,
	// running_lora_adapters, waiting_lora_adapters labels; the newest
	// sample wins).
	LoRA Selector
	// CacheInfo is an info metric whose labels CacheBlockSizeLabel and
	// CacheNumBlocksLabel give the block size and block count
	// (vLLM: block_size, num_gpu_blocks); CacheBlockSize and
	// CacheNumBlocks instead read them as gauge values.
	CacheInfo                                Selector
	CacheBlockSizeLabel, CacheNumBlocksLabel string
	CacheBlockSize, CacheNumBlocks           Selector
}

// Engines chooses each endpoint's Schema by the engine its pod declares.
// The zero Engines (and nil) reads every endpoint as vLLM or SGLang with
// their standard names, the fast path of Parse.
type Engines struct {
	// LabelKey is the pod label naming the engine (llm-d's default
	// llm-d.ai/engine-type); an endpoint without it has engine Default.
	LabelKey string
	Default  string
	// Schemas maps engine names to their schema; a nil entry is an engine
	// Parse reads natively (vLLM and SGLang with standard names). An
	// engine not in the map is read as Default.
	Schemas map[string]*Schema
}

// Engine label keys: llm-d's, and GIE's older one still honoured as a
// fallback.
const (
	EngineLabel       = "llm-d.ai/engine-type"
	EngineLabelLegacy = "inference.networking.k8s.io/engine-type"
)

// For returns the schema to read e's page with; nil means Parse.
func (g *Engines) For(e *endpoints.Endpoint) *Schema {
	if g == nil || len(g.Schemas) == 0 {
		return nil
	}
	key := g.LabelKey
	if key == "" {
		key = EngineLabel
	}
	engine := e.Label(key)
	if engine == "" && key == EngineLabel {
		engine = e.Label(EngineLabelLegacy)
	}
	s, ok := g.Schemas[engine]
	if !ok {
		s = g.Schemas[g.Default]
	}
	return s
}

// BuiltinSchemas are llm-d's built-in engine configurations: nil for the
// engines Parse reads natively.
func BuiltinSchemas() map[string]*Schema {
	must := func(spec string) Selector {
		s, err := ParseSelector(spec)
		if err != nil {
			panic(err) // the literals below
		}
		return s
	}
	return map[string]*Schema{
		"vllm":   nil,
		"sglang": nil,
		"trtllm-serve": {
			Queue: must("trtllm_num_requests_waiting"), Running: must("trtllm_num_requests_running"), KVUsage: must("trtllm_kv_cache_utilization"),
			CacheBlockSize: must("trtllm_kv_cache_tokens_per_block"), CacheNumBlocks: must("trtllm_kv_cache_max_blocks"),
		},
		"triton-tensorrt-llm": {
			Queue: must("nv_trt_llm_request_metrics{request_type=waiting}"), Running: must("nv_trt_llm_request_metrics{request_type=scheduled}"),
			KVUsage:        must("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"),
			CacheBlockSize: must("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"),
			CacheNumBlocks: must("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}"),
		},
		"triton": {Queue: must("nv_inference_pending_request_count"), Running: must("nv_inference_exec_count")},
	}
}

// ParseWith reads a page with an explicit schema: slower than Parse (every
// sample's name is read in full), for engines and metric names Parse does
// not know. The same strictness applies: a malformed sample of a wanted
// metric is a *ParseError, a page with none of queue, running and KV usage
// is ErrNoMetrics.
func ParseWith(page []byte, s *Schema) (endpoints.Metrics, error) {
	if s == nil {
		return Parse(page)
	}
	p := schemaPage{s: s}
	if err := eachSample(page, p.line); err != nil {
		return endpoints.Metrics{}, err
	}
	return p.result()
}

type schemaPage struct {
	s                    *Schema
	queue, running, kv   acc
	blockSize, numBlocks acc
	loraSeen             bool
	loraNewest           float64
	lora                 endpoints.Metrics
	cacheSeen            bool
	cacheBS, cacheNB     int
}

// wants reports whether sel reads name with labels l.
func (sel Selector) wants(name []byte, l *labels) bool {
	if sel.Name == "" || sel.Name != string(name) {
		return false
	}
	for k, v := range sel.Labels {
		if got, ok := l.get(k); !ok || got != v {
			return false
		}
	}
	return true
}

func (p *schemaPage) wantedLabel(key []byte) bool {
	s := p.s
	switch string(key) {
	case vllm.LabelMaxLoRA, vllm.LabelRunningLoRAAdapters, vllm.LabelWaitingLoRAAdapters, s.CacheBlockSizeLabel, s.CacheNumBlocksLabel:
		return len(key) > 0
	}
	for _, sel := range []*Selector{&s.Queue, &s.Running, &s.KVUsage, &s.CacheBlockSize, &s.CacheNumBlocks, &s.CacheInfo} {
		if _, ok := sel.Labels[string(key)]; ok {
			return true
		}
	}
	return false
}

func (p *schemaPage) line(line []byte) *ParseError {
	lbl := labels{want: p.wantedLabel}
	var name, rest []byte
	var err error
	if line[0] == '{' {
		if name, rest, err = lbl.parse(line, true); err != nil {
			return &ParseError{Err: err}
		}
	} else {
		i := 0
		for i < len(line) && line[i] != '{' && line[i] != ' ' && line[i] != '\t' {
			i++
		}
		name, rest = line[:i], line[i:]
		if !p.named(name) {
			return nil
		}
		if len(rest) > 0 && rest[0] == '{' {
			if _, rest, err = lbl.parse(rest, false); err != nil {
				return &ParseError{Metric: string(name), Err: err}
			}
		}
	}
	if !p.named(name) {
		return nil
	}
	fail := func(err error) *ParseError { return &ParseError{Metric: string(name), Err: err} }
	v, err := parseValue(rest)
	if err != nil {
		return fail(err)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fail(fmt.Errorf("value %v: want a finite number", v))
	}
	s := p.s
	switch {
	case s.LoRA.wants(name, &lbl):
		if p.loraSeen && v < p.loraNewest {
			return nil
		}
		if s, ok := lbl.get(vllm.LabelMaxLoRA); ok && s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return fail(fmt.Errorf("label %s=%q: not a count", vllm.LabelMaxLoRA, s))
			}
			p.lora.MaxLoRAs = n
		}
		running, _ := lbl.get(vllm.LabelRunningLoRAAdapters)
		waiting, _ := lbl.get(vllm.LabelWaitingLoRAAdapters)
		p.loraSeen, p.loraNewest = true, v
		p.lora.ActiveLoRAs, p.lora.WaitingLoRAs = adapterSet(running), adapterSet(waiting)
		return nil
	case s.CacheInfo.wants(name, &lbl):
		if p.cacheSeen {
			return nil
		}
		var e1, e2 error
		if s.CacheBlockSizeLabel != "" {
			p.cacheBS, e1 = lbl.count(s.CacheBlockSizeLabel)
		}
		if s.CacheNumBlocksLabel != "" {
			p.cacheNB, e2 = lbl.count(s.CacheNumBlocksLabel)
		}
		if err := errors.Join(e1, e2); err != nil {
			return fail(err)
		}
		p.cacheSeen = true
		return nil
	}
	if v < 0 {
		return fail(fmt.Errorf("value %v: want a non-negative number", v))
	}
	// One series may feed several fields (a selector per label value).
	for _, f := range []struct {
		sel *Selector
		a   *acc
	}{{&s.Queue, &p.queue}, {&s.Running, &p.running}, {&s.KVUsage, &p.kv}, {&s.CacheBlockSize, &p.blockSize}, {&s.CacheNumBlocks, &p.numBlocks}} {
		if f.sel.wants(name, &lbl) {
			f.a.add(v)
		}
	}
	return nil
}

// named is a cheap first test: is name any selector's metric?
func (p *schemaPage) named(name []byte) bool {
	s := p.s
	for _, sel := range []*Selector{&s.Queue, &s.Running, &s.KVUsage, &s.LoRA, &s.CacheInfo, &s.CacheBlockSize, &s.CacheNumBlocks} {
		if sel.Name != "" && sel.Name == string(name) {
			return true
		}
	}
	return false
}

func (p *schemaPage) result() (endpoints.Metrics, error) {
	var m endpoints.Metrics
	if p.queue.n == 0 && p.running.n == 0 && p.kv.n == 0 {
		return m, fmt.Errorf("%w (schema: queue %s, running %s, KV %s)", ErrNoMetrics, p.s.Queue, p.s.Running, p.s.KVUsage)
	}
	if p.queue.sum >= maxCount || p.running.sum >= maxCount {
		return m, fmt.Errorf("queue %v / running %v: implausibly large", p.queue.sum, p.running.sum)
	}
	m.WaitingQueueSize = int(math.Round(p.queue.sum))
	m.RunningRequests = int(math.Round(p.running.sum))
	if p.kv.n > 0 {
		m.KVCacheUsage = min(p.kv.mean(), 1)
	}
	if p.loraSeen {
		m.MaxLoRAs, m.ActiveLoRAs, m.WaitingLoRAs = p.lora.MaxLoRAs, p.lora.ActiveLoRAs, p.lora.WaitingLoRAs
	}
	m.BlockSize, m.NumGPUBlocks = p.cacheBS, p.cacheNB
	if p.blockSize.n > 0 && p.blockSize.sum < maxCount {
		m.BlockSize = int(p.blockSize.mean())
	}
	if p.numBlocks.n > 0 && p.numBlocks.sum < maxCount {
		m.NumGPUBlocks = int(p.numBlocks.mean())
	}
	return m, nil
}
