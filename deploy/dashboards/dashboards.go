package dashboards

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// Panel is one dashboard panel and its queries.
type Panel struct {
	// Dashboard is the heading the panel is listed under.
	Dashboard string
	// Row is the dashboard row, "" outside rows.
	Row   string
	Title string
	// Exprs are the panel's queries in order; a panel with none (a text
	// panel) is not returned.
	Exprs []string
	// Line is the panel's 1-based line in the source.
	Line int
}

// exprSeparator separates a panel's queries on its line.
const exprSeparator = " || "

// Parse reads a panel list: "## <dashboard>" (or "===== <source> <dashboard>")
// headings, "[row] <title>" lines, and "- <title> | <q1> || <q2> ..." panels.
// Other lines (prose, "source:" notes) are ignored. A panel line without the
// " | " separator is an error: it would silently drop queries.
func Parse(r io.Reader) ([]Panel, error) {
	var (
		out            []Panel
		dashboard, row string
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "## "):
			dashboard, row = strings.TrimSpace(line[3:]), ""
		case strings.HasPrefix(line, "====="):
			dashboard, row = strings.TrimSpace(strings.TrimLeft(line, "=")), ""
		case strings.HasPrefix(line, "[row]"):
			row = strings.TrimSpace(line[len("[row]"):])
		case strings.HasPrefix(line, "- "):
			title, exprs, ok := strings.Cut(line[2:], " |")
			if !ok {
				return nil, fmt.Errorf("line %d: panel without \" | \" before its queries: %q", n, line)
			}
			p := Panel{Dashboard: dashboard, Row: row, Title: strings.TrimSpace(title), Line: n}
			for e := range strings.SplitSeq(exprs, exprSeparator) {
				if e = strings.TrimSpace(e); e != "" {
					p.Exprs = append(p.Exprs, e)
				}
			}
			if len(p.Exprs) > 0 {
				out = append(out, p)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading panels: %w", err)
	}
	return out, nil
}

// variable is a Grafana template variable: $name or ${name}.
var variable = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// Substitute replaces Grafana template variables ($namespace,
// $__rate_interval, ...) with vars' values. It returns the names it found
// no value for, so that a caller never sends Prometheus an unexpanded
// variable.
func Substitute(expr string, vars map[string]string) (string, []string) {
	var missing []string
	out := variable.ReplaceAllStringFunc(expr, func(m string) string {
		name := variable.FindStringSubmatch(m)[1]
		v, ok := vars[name]
		if !ok {
			if !slices.Contains(missing, name) {
				missing = append(missing, name)
			}
			return m
		}
		return v
	})
	return out, missing
}

var (
	// Label matchers, range selectors and string literals never name a
	// metric.
	braces   = regexp.MustCompile(`\{[^{}]*\}`)
	brackets = regexp.MustCompile(`\[[^\[\]]*\]`)
	strLit   = regexp.MustCompile(`"[^"]*"`)
	// Grouping clauses list label names.
	grouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	ident    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	number   = regexp.MustCompile(`^[0-9]`)
)

// promqlWords are PromQL's functions, aggregations and keywords that occur
// where a metric name could.
var promqlWords = map[string]bool{}

func init() {
	for w := range strings.FieldsSeq(`sum avg min max count stddev stdvar topk bottomk quantile count_values group
		rate irate increase delta idelta deriv predict_linear histogram_quantile
		avg_over_time min_over_time max_over_time sum_over_time count_over_time last_over_time quantile_over_time
		abs ceil floor round clamp clamp_min clamp_max exp ln log2 log10 sqrt vector scalar time timestamp
		absent absent_over_time changes resets label_replace label_join sort sort_desc
		and or unless bool offset by without on ignoring group_left group_right inf nan`) {
		promqlWords[w] = true
	}
}

// MetricNames lists, in order of first appearance, the metric names expr
// selects. For a histogram's _bucket, _sum or _count series it gives the
// series name as written.
func MetricNames(expr string) []string {
	s := strLit.ReplaceAllString(expr, `""`)
	for {
		t := braces.ReplaceAllString(s, " ")
		t = brackets.ReplaceAllString(t, " ")
		t = grouping.ReplaceAllString(t, " ")
		if t == s {
			break
		}
		s = t
	}
	var names []string
	for _, w := range ident.FindAllString(s, -1) {
		if promqlWords[strings.ToLower(w)] || number.MatchString(w) || slices.Contains(names, w) {
			continue
		}
		names = append(names, w)
	}
	return names
}
