package all

import (
	"bufio"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/extproc/plugins/agentidentity"
	"github.com/kvgate/kvgate/extproc/plugins/alwaysdisagg"
	"github.com/kvgate/kvgate/extproc/plugins/anthropicparser"
	"github.com/kvgate/kvgate/extproc/plugins/approxprefix"
	"github.com/kvgate/kvgate/extproc/plugins/attrreporter"
	"github.com/kvgate/kvgate/extproc/plugins/burstprefix"
	"github.com/kvgate/kvgate/extproc/plugins/classload"
	"github.com/kvgate/kvgate/extproc/plugins/contextlengthaware"
	"github.com/kvgate/kvgate/extproc/plugins/coremetrics"
	"github.com/kvgate/kvgate/extproc/plugins/dataparallel"
	"github.com/kvgate/kvgate/extproc/plugins/dcgm"
	"github.com/kvgate/kvgate/extproc/plugins/disagg"
	"github.com/kvgate/kvgate/extproc/plugins/endpointattribute"
	"github.com/kvgate/kvgate/extproc/plugins/endpointnotification"
	"github.com/kvgate/kvgate/extproc/plugins/filediscovery"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/extproc/plugins/gpuhealth"
	"github.com/kvgate/kvgate/extproc/plugins/headerfilter"
	"github.com/kvgate/kvgate/extproc/plugins/headerlabelaffinity"
	"github.com/kvgate/kvgate/extproc/plugins/headerprofile"
	"github.com/kvgate/kvgate/extproc/plugins/inflightload"
	"github.com/kvgate/kvgate/extproc/plugins/joinhold"
	"github.com/kvgate/kvgate/extproc/plugins/labelselector"
	"github.com/kvgate/kvgate/extproc/plugins/latencyscorer"
	"github.com/kvgate/kvgate/extproc/plugins/latencyslo"
	"github.com/kvgate/kvgate/extproc/plugins/loadaware"
	"github.com/kvgate/kvgate/extproc/plugins/metricsdatasource"
	"github.com/kvgate/kvgate/extproc/plugins/mmcache"
	"github.com/kvgate/kvgate/extproc/plugins/models"
	"github.com/kvgate/kvgate/extproc/plugins/multiclusteraffinity"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics"
	"github.com/kvgate/kvgate/extproc/plugins/multiclusterscore"
	"github.com/kvgate/kvgate/extproc/plugins/nohitlru"
	"github.com/kvgate/kvgate/extproc/plugins/openaiparser"
	"github.com/kvgate/kvgate/extproc/plugins/p2psource"
	"github.com/kvgate/kvgate/extproc/plugins/passthroughparser"
	"github.com/kvgate/kvgate/extproc/plugins/picker"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/plugins/preciseproducer"
	"github.com/kvgate/kvgate/extproc/plugins/predictedlatency"
	"github.com/kvgate/kvgate/extproc/plugins/predictedlatencyscorer"
	"github.com/kvgate/kvgate/extproc/plugins/prefix"
	"github.com/kvgate/kvgate/extproc/plugins/prefixaffinity"
	"github.com/kvgate/kvgate/extproc/plugins/prefixpddecider"
	"github.com/kvgate/kvgate/extproc/plugins/probadmitter"
	"github.com/kvgate/kvgate/extproc/plugins/rolloutscreener"
	"github.com/kvgate/kvgate/extproc/plugins/servedverifier"
	"github.com/kvgate/kvgate/extproc/plugins/sessionaffinity"
	"github.com/kvgate/kvgate/extproc/plugins/sloheadroom"
	"github.com/kvgate/kvgate/extproc/plugins/tokenload"
	"github.com/kvgate/kvgate/extproc/plugins/tokenproducer"
	"github.com/kvgate/kvgate/extproc/plugins/topology"
	"github.com/kvgate/kvgate/extproc/plugins/transfercost"
	"github.com/kvgate/kvgate/extproc/plugins/vertexaiparser"
	"github.com/kvgate/kvgate/extproc/plugins/vllmgrpcparser"
	"github.com/kvgate/kvgate/extproc/plugins/vllmhttpparser"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/telemetry"
)

// paramsOf is the struct each plugin type decodes its parameters into (nil:
// it takes none). Every registered type must be listed, so that a new
// plugin cannot skip the documentation check; the probes below confirm
// that the factory accepts exactly these fields.
var paramsOf = map[string]any{
	"queue-scorer":                    nil,
	"kv-cache-utilization-scorer":     nil,
	"running-requests-scorer":         nil,
	tokenload.Type:                    tokenload.Params{},
	loadaware.Type:                    loadaware.Params{},
	classload.Type:                    classload.Params{},
	"lora-affinity-scorer":            nil,
	prefix.Type:                       prefix.Params{},
	precise.Type:                      precise.Params{},
	picker.MaxScoreType:               picker.Params{},
	picker.RandomType:                 picker.Params{},
	picker.WeightedRandomType:         picker.Params{},
	picker.RoundRobinType:             picker.Params{},
	"single-profile-handler":          nil,
	headerprofile.Type:                headerprofile.Params{},
	"decode-filter":                   nil,
	"prefill-filter":                  nil,
	"encode-filter":                   nil,
	inflightload.Type:                 nil,
	predictedlatency.Type:             predictedlatency.Params{},
	latencyscorer.Type:                latencyscorer.Params{},
	prefixaffinity.Type:               prefixaffinity.Params{},
	sloheadroom.Type:                  sloheadroom.Params{},
	latencyslo.Type:                   nil,
	metricsdatasource.Type:            metricsdatasource.Params{},
	coremetrics.Type:                  coremetrics.Params{},
	contextlengthaware.Type:           contextlengthaware.Params{},
	openaiparser.Type:                 nil,
	approxprefix.Type:                 approxprefix.Params{},
	nohitlru.Type:                     nohitlru.Params{},
	preciseproducer.Type:              precise.Params{},
	endpointnotification.Type:         nil,
	tokenproducer.Type:                tokenproducer.Params{},
	sessionaffinity.Type:              sessionaffinity.Params{},
	labelselector.Type:                labelselector.Params{},
	labelselector.ByLabelType:         labelselector.ByLabelParams{},
	disagg.Type:                       disagg.Params{},
	disagg.PDType:                     disagg.PDParams{},
	disagg.HeadersType:                disagg.HeadersParams{},
	disagg.PrefillHeaderType:          disagg.HeadersParams{},
	prefixpddecider.Type:              prefixpddecider.Params{},
	alwaysdisagg.PDType:               nil,
	alwaysdisagg.MultimodalType:       nil,
	p2psource.Type:                    p2psource.Params{},
	transfercost.Type:                 transfercost.Params{},
	flowpolicy.GlobalStrictType:       nil,
	flowpolicy.RoundRobinType:         nil,
	flowpolicy.ProgramAwareType:       flowpolicy.ProgramAwareParams{},
	flowpolicy.FCFSType:               nil,
	flowpolicy.EDFType:                nil,
	flowpolicy.SLODeadlineType:        nil,
	flowpolicy.StaticLimitType:        flowpolicy.StaticLimitParams{},
	flowpolicy.HoldbackType:           flowpolicy.HoldbackParams{},
	flowpolicy.SoftReflectType:        nil,
	flowpolicy.PresenceType:           flowpolicy.PresenceParams{},
	flowpolicy.UtilizationType:        flowpolicy.UtilizationParams{},
	flowpolicy.ConcurrencyType:        flowpolicy.ConcurrencyParams{},
	flowpolicy.DecodeStepType:         flowpolicy.DecodeStepParams{},
	gpuhealth.FilterType:              gpuhealth.FilterParams{},
	gpuhealth.ScorerType:              gpuhealth.ScorerParams{},
	headerfilter.Type:                 nil,
	probadmitter.Type:                 probadmitter.Params{},
	passthroughparser.Type:            nil,
	anthropicparser.Type:              nil,
	vllmhttpparser.Type:               nil,
	vertexaiparser.Type:               nil,
	agentidentity.Type:                agentidentity.Params{},
	filediscovery.Type:                filediscovery.Params{},
	attrreporter.Type:                 attrreporter.Params{},
	servedverifier.Type:               nil,
	vllmgrpcparser.Type:               nil,
	models.SourceType:                 metricsdatasource.Params{},
	models.ExtractorType:              nil,
	dcgm.SourceType:                   dcgm.Params{},
	dcgm.ExtractorType:                nil,
	endpointattribute.FilterType:      endpointattribute.FilterParams{},
	endpointattribute.ScorerType:      endpointattribute.ScorerParams{},
	burstprefix.Type:                  burstprefix.Params{},
	joinhold.Type:                     joinhold.Params{},
	mmcache.ProducerType:              mmcache.ProducerParams{},
	mmcache.ScorerType:                mmcache.ScorerParams{},
	topology.ExtractorType:            topology.ExtractorParams{},
	topology.FilterType:               topology.FilterParams{},
	topology.ScorerType:               topology.ScorerParams{},
	dataparallel.Type:                 dataparallel.Params{},
	rolloutscreener.Type:              rolloutscreener.Params{},
	headerlabelaffinity.Type:          headerlabelaffinity.Params{},
	multiclustermetrics.SourceType:    metricsdatasource.Params{},
	multiclustermetrics.ExtractorType: multiclustermetrics.ExtractorParams{},
	multiclusterscore.KVCacheType:     nil,
	multiclusterscore.QueueType:       nil,
	multiclusteraffinity.Type:         sessionaffinity.Params{},
	filediscovery.MultiClusterType:    filediscovery.Params{},
	predictedlatencyscorer.Type:       predictedlatencyscorer.Params{},
}

// The README's plugin table, each plugin package's documented parameters,
// the parameters its factory accepts and the registry all agree.
func TestDocsAgreeWithRegistry(t *testing.T) {
	rows := readmePluginTable(t, "../../../README.md")
	r := Registry()
	tel, err := telemetry.New(telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := &scheduling.Handle{Services: map[string]any{precise.ServiceKVIndex: kvindex.New(kvindex.Config{}), telemetry.ServiceKey: tel}}

	inReadme := map[string]readmeRow{}
	for _, row := range rows {
		for _, typ := range append(slices.Clone(row.types), row.aliases...) {
			if _, dup := inReadme[typ]; dup {
				t.Errorf("README: %s is listed twice", typ)
			}
			inReadme[typ] = row
		}
	}
	registered := r.Types()
	for _, typ := range registered {
		if _, ok := inReadme[typ]; !ok {
			t.Errorf("registered type %s is missing from the README's plugin table", typ)
		}
	}
	for typ := range inReadme {
		if !slices.Contains(registered, typ) {
			t.Errorf("README lists %s, which is not registered", typ)
		}
	}

	docs := map[string]*doc.Package{}
	for _, typ := range registered {
		row, ok := inReadme[typ]
		if !ok {
			continue
		}
		p, err := r.Build(typ, "", minimalParams(typ, ""), h)
		if err != nil {
			t.Errorf("%s: %v", typ, err)
			continue
		}
		canonical := p.TypedName().Type
		if !slices.Contains(row.types, canonical) {
			t.Errorf("README row %v lists %s, which builds a %s", row.types, typ, canonical)
		}
		if !isKind(p, row.kind) {
			t.Errorf("README: %s is not a %s", typ, row.kind)
		}
		if typ != canonical {
			continue // aliases share their type's parameters
		}
		v, ok := paramsOf[typ]
		if !ok {
			t.Errorf("%s: add its parameters struct (or nil) to paramsOf", typ)
			continue
		}
		fields := jsonFields(v)
		probeParams(t, r, h, typ, fields)
		if !slices.Equal(row.params, fields) {
			t.Errorf("README parameters of %s = %v, its factory accepts %v", typ, row.params, fields)
		}
		documented, where := documentedParams(t, docs, p)
		if !slices.Equal(documented, fields) {
			t.Errorf("%s documents parameters %v, its factory accepts %v", where, documented, fields)
		}
	}
}

// kinds maps the README's kind column to the interface a plugin of that
// kind implements.
var kinds = map[string]reflect.Type{
	"scorer":             reflect.TypeFor[scheduling.Scorer](),
	"filter":             reflect.TypeFor[scheduling.Filter](),
	"picker":             reflect.TypeFor[scheduling.Picker](),
	"profile handler":    reflect.TypeFor[scheduling.ProfileHandler](),
	"data producer":      reflect.TypeFor[scheduling.DataProducer](),
	"admitter":           reflect.TypeFor[scheduling.Admitter](),
	"screener":           reflect.TypeFor[scheduling.Screener](),
	"data source":        reflect.TypeFor[scheduling.DataSource](),
	"data extractor":     reflect.TypeFor[scheduling.DataExtractor](),
	"request parser":     reflect.TypeFor[scheduling.RequestParser](),
	"request header":     reflect.TypeFor[scheduling.RequestHeader](),
	"endpoint discovery": reflect.TypeFor[interface{ EndpointSource() endpoints.Source }](),
	"response header":    reflect.TypeFor[scheduling.ResponseHeader](),
	"response metadata":  reflect.TypeFor[scheduling.ResponseMetadata](),
	"pre-request":        reflect.TypeFor[scheduling.PreRequest](),
	"decider":            reflect.TypeFor[disagg.Decider](),
	// Flow-control plugins (extproc/flowcontrol), referenced from the
	// flowControl section; the detectors are also filters.
	"fairness policy":     reflect.TypeFor[flowcontrol.FairnessPolicy](),
	"ordering policy":     reflect.TypeFor[flowcontrol.OrderingPolicy](),
	"usage-limit policy":  reflect.TypeFor[flowcontrol.UsageLimitPolicy](),
	"saturation detector": reflect.TypeFor[flowcontrol.SaturationDetector](),
}

func isKind(p scheduling.Plugin, kind string) bool {
	iface, ok := kinds[kind]
	return ok && reflect.TypeOf(p).Implements(iface)
}

// probeParams checks that the factory decodes exactly fields: each one is
// accepted (null keeps its default, so no value can fail validation) and a
// name outside them is refused.
func probeParams(t *testing.T, r *scheduling.Registry, h *scheduling.Handle, typ string, fields []string) {
	t.Helper()
	for _, f := range fields {
		if _, err := r.Build(typ, "", minimalParams(typ, f), h); err != nil {
			t.Errorf("%s: declared parameter %s refused: %v", typ, f, err)
		}
	}
	if _, err := r.Build(typ, "", minimalParams(typ, "kvgateUndeclaredProbe"), h); err == nil {
		t.Errorf("%s accepts an undeclared parameter: its parameters are not decoded strictly", typ)
	}
}

// jsonFields returns the sorted JSON names of a parameters struct's fields.
func jsonFields(v any) []string {
	out := []string{}
	if v == nil {
		return out
	}
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		f := rt.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

type readmeRow struct {
	types, aliases []string
	kind           string
	params         []string
}

// readmePluginTable returns the rows of the table with columns "type | kind
// | parameters (default)" in the README section on kvgate epp.
func readmePluginTable(t *testing.T, path string) []readmeRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []readmeRow
	section, table := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "#"):
			section = line == "### `kvgate epp`"
			table = false
		case !section:
		case !strings.HasPrefix(line, "|"):
			table = false
		case table:
			cells := strings.Split(strings.Trim(line, "|"), "|")
			if len(cells) != 3 {
				t.Fatalf("README plugin table row %q has %d cells", line, len(cells))
			}
			if strings.Trim(cells[0], " -") == "" {
				continue // the header's separator row
			}
			var row readmeRow
			row.types, row.aliases = ticked(cells[0])
			row.kind = strings.TrimSpace(cells[1])
			row.params, _ = ticked(cells[2])
			sort.Strings(row.params)
			rows = append(rows, row)
		default:
			table = strings.Join(strings.Fields(line), " ") == "| type | kind | parameters (default) |"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no plugin table (type | kind | parameters (default)) under ### `kvgate epp`", path)
	}
	return rows
}

// ticked returns the `quoted` names of a table cell: those outside
// parentheses, and those inside (aliases, or notes such as a pod label).
func ticked(cell string) (outside, inside []string) {
	depth := 0
	for cell != "" {
		switch c := cell[0]; {
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == '`':
			name, rest, ok := strings.Cut(cell[1:], "`")
			if !ok {
				return outside, inside
			}
			if depth > 0 {
				inside = append(inside, name)
			} else {
				outside = append(outside, name)
			}
			cell = rest
			continue
		}
		cell = cell[1:]
	}
	return outside, inside
}

// documentedParams returns the parameter names documented for plugin p: in
// its Go type's doc comment when that has a Parameters section, else in its
// package's doc comment. where names the comment.
func documentedParams(t *testing.T, cache map[string]*doc.Package, p scheduling.Plugin) (names []string, where string) {
	t.Helper()
	rt := reflect.TypeOf(p)
	if rt.Kind() == reflect.Pointer {
		rt = rt.Elem()
	}
	dir := filepath.Join("..", filepath.Base(rt.PkgPath()))
	pkg, ok := cache[dir]
	if !ok {
		pkg = parseDoc(t, dir)
		cache[dir] = pkg
	}
	for _, typ := range pkg.Types {
		if typ.Name == rt.Name() {
			if names, ok := parametersSection(typ.Doc); ok {
				return names, "type " + pkg.Name + "." + typ.Name
			}
		}
	}
	names, ok = parametersSection(pkg.Doc)
	if !ok {
		t.Errorf("package %s documents no parameters (want a Parameters section, or \"Parameters: none.\")", pkg.Name)
	}
	return names, "package " + pkg.Name
}

func parseDoc(t *testing.T, dir string) *doc.Package {
	t.Helper()
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, m, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	pkg, err := doc.NewFromFiles(fset, files, "")
	if err != nil {
		t.Fatal(err)
	}
	return pkg
}

var paramLine = regexp.MustCompile(`^\t([A-Za-z][A-Za-z0-9]*):\s`)

// parametersSection reads the convention plugin packages document their
// parameters in: a paragraph starting "Parameters" that is either
// "Parameters: none." or followed by a code block of "name: type  meaning"
// lines (more deeply indented lines continue the meaning).
func parametersSection(comment string) (names []string, ok bool) {
	lines := strings.Split(comment, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "Parameters") {
			continue
		}
		names = []string{}
		if strings.HasPrefix(l, "Parameters: none") {
			return names, true
		}
		for _, l := range lines[i+1:] {
			if l == "" {
				if len(names) == 0 {
					continue
				}
				break
			}
			if !strings.HasPrefix(l, "\t") {
				break
			}
			if m := paramLine.FindStringSubmatch(l); m != nil {
				names = append(names, m[1])
			}
		}
		sort.Strings(names)
		return names, true
	}
	return nil, false
}
