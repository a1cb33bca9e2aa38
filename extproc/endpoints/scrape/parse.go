package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/internal/vllm"
)

// ErrNoMetrics means a page parsed but carried none of the load metrics the
// picker routes on (queue, running, KV usage): the target is not a supported
// model server, or is misconfigured, and must not look idle.
var ErrNoMetrics = errors.New("no vLLM or SGLang load metrics on the page")

// ParseError locates a malformed line the parser needed.
type ParseError struct {
	Line   int    // 1-based
	Metric string // empty when the name itself could not be read
	Err    error
}

func (e *ParseError) Error() string {
	if e.Metric == "" {
		return fmt.Sprintf("metrics line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("metrics line %d (%s): %v", e.Line, e.Metric, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// maxCount bounds the integer metrics so that float→int never overflows.
const maxCount = 1 << 31

// family identifies the handful of series the picker reads; everything else
// on the page is skipped after reading its name.
type family uint8

const (
	famNone family = iota
	famVLLMWaiting
	famVLLMRunning
	famVLLMKV
	famVLLMKVLegacy
	famVLLMLoRA
	famVLLMCacheConfig
	famSGLWaiting
	famSGLRunning
	famSGLTokenUsage
)

var families = map[string]family{
	vllm.MetricNumRequestsWaiting: famVLLMWaiting,
	vllm.MetricNumRequestsRunning: famVLLMRunning,
	vllm.MetricKVCacheUsagePerc:   famVLLMKV,
	vllm.MetricGPUCacheUsagePerc:  famVLLMKVLegacy,
	vllm.MetricLoRARequestsInfo:   famVLLMLoRA,
	vllm.MetricCacheConfigInfo:    famVLLMCacheConfig,
	"sglang:num_queue_reqs":       famSGLWaiting,
	"sglang:num_running_reqs":     famSGLRunning,
	"sglang:token_usage":          famSGLTokenUsage,
}

// longestName lets the scanner give up on a name as soon as it is longer
// than every wanted one: most of a page is histogram series whose names are.
var longestName = func() int {
	n := 0
	for name := range families {
		n = max(n, len(name))
	}
	return n
}()

// lookup does not allocate: the compiler keys the map with the bytes.
func lookup(name []byte) family { return families[string(name)] }

// acc accumulates one family's samples. Servers label these gauges per
// model_name (and per engine under data parallelism); counts are summed,
// fractions averaged, because a data-parallel server balances work across
// its engines and its capacity is their mean.
type acc struct {
	sum float64
	n   int
}

func (a *acc) add(v float64) { a.sum += v; a.n++ }

func (a *acc) mean() float64 { return a.sum / float64(a.n) }

type pageState struct {
	fam [famSGLTokenUsage + 1]acc

	loraNewest  float64
	loraSeen    bool
	loraMax     int
	loraRunning string
	loraWaiting string

	cacheSeen    bool
	blockSize    int
	numGPUBlocks int
}

// Parse reads a Prometheus text-format /metrics page (as vLLM and SGLang
// serve it) into a snapshot; UpdateTime is left zero for the caller.
//
// It is deliberately lenient about lines it does not need (they are skipped
// once their name is known, which is what makes a 1,000-line histogram-heavy
// page cost microseconds) and strict about the lines it does: a malformed
// label set or value there is a *ParseError. Non-finite values and negative
// loads are errors too, since routing on them would be arbitrary.
func Parse(page []byte) (endpoints.Metrics, error) {
	var st pageState
	if err := eachSample(page, st.line); err != nil {
		return endpoints.Metrics{}, err
	}
	return st.result()
}

// eachSample calls fn with every sample line of a page (comments and blank
// lines skipped), numbering the line of the error it returns.
func eachSample(page []byte, fn func(line []byte) *ParseError) error {
	lineNo := 0
	for len(page) > 0 {
		var line []byte
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i], page[i+1:]
		} else {
			line, page = page, nil
		}
		lineNo++
		line = trimLeft(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if err := fn(line); err != nil {
			err.Line = lineNo
			return err
		}
	}
	return nil
}

func (st *pageState) line(line []byte) *ParseError {
	var (
		name []byte
		fam  family
		rest []byte
	)
	if line[0] == '{' {
		// UTF-8 exposition: {"metric.name", label="v"} value. Rare, so
		// the labels are parsed before the name is known.
		var lbl labels
		var err error
		name, rest, err = lbl.parse(line, true)
		if err != nil {
			return &ParseError{Err: err}
		}
		if fam = lookup(name); fam == famNone {
			return nil
		}
		return st.sample(fam, name, &lbl, rest)
	}
	i := nameEnd(line)
	if i < 0 {
		return nil
	}
	name, rest = line[:i], line[i:]
	if fam = lookup(name); fam == famNone {
		return nil
	}
	var lbl labels
	if len(rest) > 0 && rest[0] == '{' {
		var err error
		if _, rest, err = lbl.parse(rest, false); err != nil {
			return &ParseError{Metric: string(name), Err: err}
		}
	}
	return st.sample(fam, name, &lbl, rest)
}

func (st *pageState) sample(fam family, name []byte, lbl *labels, rest []byte) *ParseError {
	fail := func(err error) *ParseError { return &ParseError{Metric: string(name), Err: err} }
	v, err := parseValue(rest)
	if err != nil {
		return fail(err)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fail(fmt.Errorf("value %v: want a finite number", v))
	}
	switch fam {
	case famVLLMLoRA:
		// The value is the time the label set was last true; the newest
		// sample describes the current adapters.
		if st.loraSeen && v <= st.loraNewest {
			return nil
		}
		maxLoRA := 0
		if s, ok := lbl.get(vllm.LabelMaxLoRA); ok && s != "" {
			if maxLoRA, err = strconv.Atoi(s); err != nil || maxLoRA < 0 {
				return fail(fmt.Errorf("label %s=%q: not a count", vllm.LabelMaxLoRA, s))
			}
		}
		running, _ := lbl.get(vllm.LabelRunningLoRAAdapters)
		waiting, _ := lbl.get(vllm.LabelWaitingLoRAAdapters)
		st.loraSeen, st.loraNewest = true, v
		st.loraMax, st.loraRunning, st.loraWaiting = maxLoRA, running, waiting
		return nil
	case famVLLMCacheConfig:
		if st.cacheSeen {
			return nil
		}
		bs, err1 := lbl.count(vllm.LabelBlockSize)
		nb, err2 := lbl.count(vllm.LabelNumGPUBlocks)
		if err := errors.Join(err1, err2); err != nil {
			return fail(err)
		}
		st.cacheSeen, st.blockSize, st.numGPUBlocks = true, bs, nb
		return nil
	}
	if v < 0 {
		return fail(fmt.Errorf("value %v: want a non-negative number", v))
	}
	st.fam[fam].add(v)
	return nil
}

func (st *pageState) result() (endpoints.Metrics, error) {
	var m endpoints.Metrics
	pick := func(fams ...family) (acc, bool) {
		for _, f := range fams {
			if st.fam[f].n > 0 {
				return st.fam[f], true
			}
		}
		return acc{}, false
	}
	// A server is vLLM or SGLang; vLLM's names win if a page has both.
	w, okW := pick(famVLLMWaiting, famSGLWaiting)
	r, okR := pick(famVLLMRunning, famSGLRunning)
	kv, okKV := pick(famVLLMKV, famVLLMKVLegacy, famSGLTokenUsage)
	if !okW && !okR && !okKV {
		return m, ErrNoMetrics
	}
	if w.sum >= maxCount || r.sum >= maxCount {
		return m, fmt.Errorf("queue %v / running %v: implausibly large", w.sum, r.sum)
	}
	m.WaitingQueueSize = int(math.Round(w.sum))
	m.RunningRequests = int(math.Round(r.sum))
	if okKV {
		m.KVCacheUsage = min(kv.mean(), 1)
	}
	if st.loraSeen {
		m.MaxLoRAs = st.loraMax
		m.ActiveLoRAs = adapterSet(st.loraRunning)
		m.WaitingLoRAs = adapterSet(st.loraWaiting)
	}
	m.BlockSize, m.NumGPUBlocks = st.blockSize, st.numGPUBlocks
	return m, nil
}

// adapterSet splits vLLM's comma-separated adapter list.
func adapterSet(list string) map[string]struct{} {
	set := map[string]struct{}{}
	for a := range strings.SplitSeq(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			set[a] = struct{}{}
		}
	}
	return set
}

// parseValue reads the sample value; an optional timestamp (and, in
// OpenMetrics, an exemplar) may follow and is ignored.
func parseValue(rest []byte) (float64, error) {
	rest = trimLeft(rest)
	end := bytes.IndexAny(rest, " \t")
	if end < 0 {
		end = len(rest)
	}
	tok := bytes.TrimRight(rest[:end], "\r")
	if len(tok) == 0 {
		return 0, errors.New("missing value")
	}
	v, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return 0, fmt.Errorf("value %q: %w", tok, err)
	}
	return v, nil
}

// nameEnd finds the end of a metric name, or returns -1 once the name is
// too long to be wanted.
func nameEnd(line []byte) int {
	for i, c := range line[:min(len(line), longestName+1)] {
		if c == '{' || c == ' ' || c == '\t' {
			return i
		}
	}
	if len(line) <= longestName {
		return len(line)
	}
	return -1
}

func trimLeft(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// wantedLabel reports whether the picker reads a label; only those are
// kept, so ordinary samples cost no allocation and a server's long info
// label sets (cache_config_info has ~16) cannot crowd out the ones needed.
func wantedLabel(name []byte) bool {
	switch string(name) {
	case vllm.LabelMaxLoRA, vllm.LabelRunningLoRAAdapters, vllm.LabelWaitingLoRAAdapters, vllm.LabelBlockSize, vllm.LabelNumGPUBlocks:
		return true
	}
	return false
}

// maxLabels bounds the kept pairs; a repeated wanted label fills a slot
// per repetition and the first occurrence wins.
const maxLabels = 8

type labelPair struct{ name, value string }

// labels is one sample's wanted labels, on the stack.
type labels struct {
	pairs [maxLabels]labelPair
	n     int
	// want, when set, replaces wantedLabel (ParseWith's schemas read
	// other labels).
	want func(name []byte) bool
}

func (l *labels) get(name string) (string, bool) {
	for _, p := range l.pairs[:l.n] {
		if p.name == name {
			return p.value, true
		}
	}
	return "", false
}

// count reads an integer label; a missing label or vLLM's "None" is 0.
func (l *labels) count(name string) (int, error) {
	s, ok := l.get(name)
	if !ok || s == "" || s == "None" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("label %s=%q: not a count", name, s)
	}
	return n, nil
}

// parse reads "{...}" at the start of b and returns what follows. With
// nameAllowed, a bare quoted string inside the braces is the metric name
// (the UTF-8 exposition form), returned as name.
func (l *labels) parse(b []byte, nameAllowed bool) (name, rest []byte, err error) {
	b = b[1:] // '{'
	for {
		b = trimLeft(b)
		if len(b) == 0 {
			return nil, nil, errors.New("unterminated label set")
		}
		if b[0] == '}' {
			return name, b[1:], nil
		}
		var key []byte
		if b[0] == '"' {
			if key, b, err = quoted(b); err != nil {
				return nil, nil, err
			}
		} else {
			i := 0
			for i < len(b) && isLabelNameByte(b[i], i == 0) {
				i++
			}
			if i == 0 {
				return nil, nil, fmt.Errorf("bad label name at %q", clip(b))
			}
			key, b = b[:i], b[i:]
		}
		b = trimLeft(b)
		switch {
		case len(b) == 0:
			return nil, nil, errors.New("unterminated label set")
		case b[0] != '=':
			if !nameAllowed || name != nil || len(key) == 0 || (b[0] != ',' && b[0] != '}') {
				return nil, nil, fmt.Errorf("want '=' after label %q", key)
			}
			name = key
		default:
			b = trimLeft(b[1:])
			if len(b) == 0 || b[0] != '"' {
				return nil, nil, fmt.Errorf("label %q: value must be quoted", key)
			}
			var v []byte
			if v, b, err = quoted(b); err != nil {
				return nil, nil, fmt.Errorf("label %q: %w", key, err)
			}
			if l.n < maxLabels && ((l.want == nil && wantedLabel(key)) || (l.want != nil && l.want(key))) {
				l.pairs[l.n] = labelPair{string(key), string(v)}
				l.n++
			}
		}
		b = trimLeft(b)
		if len(b) > 0 && b[0] == ',' {
			b = b[1:]
		} else if len(b) == 0 || b[0] != '}' {
			return nil, nil, fmt.Errorf("want ',' or '}' at %q", clip(b))
		}
	}
}

// quoted reads a double-quoted string with the exposition format's escapes
// (\\, \", \n) starting at b[0] == '"'. Without escapes the result aliases b.
func quoted(b []byte) (s, rest []byte, err error) {
	b = b[1:]
	end := bytes.IndexAny(b, "\"\\")
	if end >= 0 && b[end] == '"' {
		return b[:end], b[end+1:], nil
	}
	var out []byte
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			return out, b[i+1:], nil
		case '\\':
			if i+1 == len(b) {
				return nil, nil, errors.New("unterminated escape")
			}
			i++
			switch b[i] {
			case '\\', '"':
				out = append(out, b[i])
			case 'n':
				out = append(out, '\n')
			default:
				return nil, nil, fmt.Errorf("invalid escape \\%c", b[i])
			}
		default:
			out = append(out, c)
		}
	}
	return nil, nil, errors.New("unterminated quoted string")
}

func isLabelNameByte(c byte, first bool) bool {
	return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || (!first && '0' <= c && c <= '9')
}

func clip(b []byte) string {
	if len(b) > 20 {
		b = b[:20]
	}
	return string(b)
}
