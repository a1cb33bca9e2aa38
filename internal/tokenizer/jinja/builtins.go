package jinja

import (
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// globals are the functions HF chat templates may call.
func globals() map[string]Value {
	return map[string]Value{
		"namespace": callable(func(_ *renderer, args []Value, kw map[string]Value) (Value, error) {
			d := NewDict()
			d.namespace = true
			if len(args) == 1 {
				if src, ok := args[0].(*Dict); ok {
					for _, k := range src.keys {
						d.Set(k, src.m[k])
					}
				}
			}
			for _, k := range sortedKeys(kw) {
				d.Set(k, kw[k])
			}
			return d, nil
		}),
		"dict": callable(func(_ *renderer, _ []Value, kw map[string]Value) (Value, error) {
			d := NewDict()
			for _, k := range sortedKeys(kw) {
				d.Set(k, kw[k])
			}
			return d, nil
		}),
		"raise_exception": callable(func(_ *renderer, args []Value, _ map[string]Value) (Value, error) {
			msg := ""
			if len(args) > 0 {
				msg = str(args[0])
			}
			return nil, &RaisedError{Message: msg}
		}),
		"range": callable(func(_ *renderer, args []Value, _ map[string]Value) (Value, error) {
			var b [3]int64
			b[2] = 1
			switch len(args) {
			case 1:
				b[1], _ = asInt(args[0])
			case 2, 3:
				for i, a := range args {
					n, ok := asInt(a)
					if !ok {
						return nil, errorf("range arguments must be integers")
					}
					b[i] = n
				}
			default:
				return nil, errorf("range takes 1 to 3 arguments")
			}
			if b[2] == 0 {
				return nil, errorf("range step cannot be zero")
			}
			n := int64(0)
			if d := b[1] - b[0]; d != 0 && (d > 0) == (b[2] > 0) {
				n = (d-sign(b[2]))/b[2] + 1
			}
			if n > maxIterations {
				return nil, errorf("range longer than %d", maxIterations)
			}
			out := make([]Value, n)
			for i := range out {
				out[i] = b[0] + int64(i)*b[2]
			}
			return out, nil
		}),
		// transformers provides strftime_now for templates that print the
		// current date (Llama 3.1).
		"strftime_now": callable(func(_ *renderer, args []Value, _ map[string]Value) (Value, error) {
			if len(args) != 1 {
				return nil, errorf("strftime_now takes a format")
			}
			return strftime(time.Now(), str(args[0])), nil
		}),
	}
}

func sign(n int64) int64 {
	if n < 0 {
		return -1
	}
	return 1
}

func sortedKeys(m map[string]Value) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// strftime supports the directives date-printing templates use.
func strftime(t time.Time, f string) string {
	repl := strings.NewReplacer("%d", t.Format("02"), "%m", t.Format("01"), "%Y", t.Format("2006"),
		"%y", t.Format("06"), "%b", t.Format("Jan"), "%B", t.Format("January"), "%H", t.Format("15"),
		"%M", t.Format("04"), "%S", t.Format("05"), "%a", t.Format("Mon"), "%A", t.Format("Monday"), "%%", "%",
		"%-d", strconv.Itoa(t.Day()), "%-m", strconv.Itoa(int(t.Month())))
	return repl.Replace(f)
}

// method returns the bound method name of obj, or nil.
func method(obj Value, name string) Value {
	switch x := obj.(type) {
	case string:
		return stringMethod(x, name)
	case *Dict:
		switch name {
		case "items":
			return callable(func(*renderer, []Value, map[string]Value) (Value, error) { return dictItems(x), nil })
		case "keys":
			return callable(func(*renderer, []Value, map[string]Value) (Value, error) { return iterate(x) })
		case "values":
			return callable(func(*renderer, []Value, map[string]Value) (Value, error) {
				out := make([]Value, len(x.keys))
				for i, k := range x.keys {
					out[i] = x.m[k]
				}
				return out, nil
			})
		case "get":
			return callable(func(_ *renderer, args []Value, _ map[string]Value) (Value, error) {
				if len(args) == 0 {
					return nil, errorf("get needs a key")
				}
				if v, ok := x.m[str(args[0])]; ok {
					return v, nil
				}
				if len(args) > 1 {
					return args[1], nil
				}
				return nil, nil
			})
		}
	}
	return nil
}

func dictItems(d *Dict) []Value {
	out := make([]Value, len(d.keys))
	for i, k := range d.keys {
		out[i] = []Value{k, d.m[k]}
	}
	return out
}

func stringMethod(s, name string) Value {
	argStr := func(args []Value, i int) (string, bool) {
		if i >= len(args) || args[i] == nil {
			return "", false
		}
		return str(args[i]), true
	}
	fn := func(f func(args []Value) (Value, error)) Value {
		return callable(func(_ *renderer, args []Value, _ map[string]Value) (Value, error) { return f(args) })
	}
	switch name {
	case "startswith", "endswith":
		return fn(func(args []Value) (Value, error) {
			if len(args) == 0 {
				return nil, errorf("%s needs an argument", name)
			}
			cands := []Value{args[0]}
			if l, ok := args[0].([]Value); ok {
				cands = l
			}
			for _, c := range cands {
				p := str(c)
				if (name == "startswith" && strings.HasPrefix(s, p)) || (name == "endswith" && strings.HasSuffix(s, p)) {
					return true, nil
				}
			}
			return false, nil
		})
	case "strip", "lstrip", "rstrip":
		return fn(func(args []Value) (Value, error) {
			chars, ok := argStr(args, 0)
			return pyStrip(s, name, chars, ok), nil
		})
	case "split", "rsplit":
		return fn(func(args []Value) (Value, error) {
			sep, hasSep := argStr(args, 0)
			limit := int64(-1)
			if len(args) > 1 {
				limit, _ = asInt(args[1])
			}
			return pySplit(s, sep, hasSep, limit, name == "rsplit")
		})
	case "upper":
		return fn(func([]Value) (Value, error) { return strings.ToUpper(s), nil })
	case "lower":
		return fn(func([]Value) (Value, error) { return strings.ToLower(s), nil })
	case "title":
		return fn(func([]Value) (Value, error) { return title(s), nil })
	case "capitalize":
		return fn(func([]Value) (Value, error) { return capitalize(s), nil })
	case "replace":
		return fn(func(args []Value) (Value, error) {
			if len(args) < 2 {
				return nil, errorf("replace needs two arguments")
			}
			n := -1
			if len(args) > 2 {
				c, _ := asInt(args[2])
				n = int(c)
			}
			return strings.Replace(s, str(args[0]), str(args[1]), n), nil
		})
	case "find":
		return fn(func(args []Value) (Value, error) {
			sub, _ := argStr(args, 0)
			i := strings.Index(s, sub)
			if i < 0 {
				return int64(-1), nil
			}
			return int64(runeLen(s[:i])), nil
		})
	case "count":
		return fn(func(args []Value) (Value, error) {
			sub, _ := argStr(args, 0)
			if sub == "" {
				return int64(runeLen(s) + 1), nil
			}
			return int64(strings.Count(s, sub)), nil
		})
	case "join":
		return fn(func(args []Value) (Value, error) {
			if len(args) == 0 {
				return nil, errorf("join needs an iterable")
			}
			items, err := iterate(args[0])
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				parts[i] = str(it)
			}
			return strings.Join(parts, s), nil
		})
	case "isdigit", "isspace", "isalpha", "isalnum", "isupper", "islower":
		return fn(func([]Value) (Value, error) { return strPredicate(s, name), nil })
	case "format":
		return fn(func(args []Value) (Value, error) {
			out := s
			for _, a := range args {
				out = strings.Replace(out, "{}", str(a), 1)
			}
			return out, nil
		})
	}
	return nil
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		ok := true
		switch name {
		case "isdigit":
			ok = unicode.IsDigit(r)
		case "isspace":
			ok = unicode.IsSpace(r)
		case "isalpha":
			ok = unicode.IsLetter(r)
		case "isalnum":
			ok = unicode.IsLetter(r) || unicode.IsNumber(r)
		case "isupper":
			ok = !unicode.IsLower(r)
			cased = cased || unicode.IsUpper(r)
		case "islower":
			ok = !unicode.IsUpper(r)
			cased = cased || unicode.IsLower(r)
		}
		if !ok {
			return false
		}
	}
	if name == "isupper" || name == "islower" {
		return cased
	}
	return true
}

// pyStrip is str.strip/lstrip/rstrip: whitespace by default, else any of
// chars.
func pyStrip(s, which, chars string, hasChars bool) string {
	cut := func(r rune) bool {
		if hasChars {
			return strings.ContainsRune(chars, r)
		}
		return unicode.IsSpace(r)
	}
	if which != "rstrip" {
		s = strings.TrimLeftFunc(s, cut)
	}
	if which != "lstrip" {
		s = strings.TrimRightFunc(s, cut)
	}
	return s
}

// pySplit is str.split/rsplit.
func pySplit(s, sep string, hasSep bool, limit int64, fromRight bool) (Value, error) {
	if limit > int64(len(s)) {
		limit = -1 // cannot bind; also keeps limit+1 from overflowing
	}
	var parts []string
	switch {
	case hasSep && sep == "":
		return nil, errorf("empty separator")
	case hasSep && limit < 0:
		parts = strings.Split(s, sep)
	case hasSep && !fromRight:
		parts = strings.SplitN(s, sep, int(limit)+1)
	case hasSep:
		rev := strings.Split(s, sep)
		if int64(len(rev)) > limit+1 {
			head := strings.Join(rev[:int64(len(rev))-limit], sep)
			parts = append([]string{head}, rev[int64(len(rev))-limit:]...)
		} else {
			parts = rev
		}
	default:
		parts = strings.Fields(s)
		if limit >= 0 && int64(len(parts)) > limit+1 {
			// Rare in templates; keep the remainder joined by one space.
			parts = append(parts[:limit], strings.Join(parts[limit:], " "))
		}
	}
	out := make([]Value, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func title(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(r))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsLetter(r)
	}
	return b.String()
}

func capitalize(s string) string {
	for i, r := range s {
		if i == 0 {
			return string(unicode.ToUpper(r)) + strings.ToLower(s[len(string(r)):])
		}
	}
	return s
}

func (r *renderer) evalFilter(e filterExpr) (Value, error) {
	x, err := r.eval(e.x)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(e.args, e.kwName, e.kwVal)
	if err != nil {
		return nil, err
	}
	return r.applyFilter(e.name, x, args, kw)
}

func (r *renderer) applyFilter(name string, x Value, args []Value, kw map[string]Value) (Value, error) {
	f, ok := filters[name]
	if !ok {
		return nil, errorf("unknown filter %q", name)
	}
	return f(r, filterCall{name: name, x: x, args: args, kw: kw})
}

// filterCall is one application of a filter: its name (filters registered
// under several names tell them apart), the filtered value and the
// arguments.
type filterCall struct {
	name string
	x    Value
	args []Value
	kw   map[string]Value
}

// arg is the i-th positional argument, else the keyword argument key, as
// Python binds a parameter either way.
func (c filterCall) arg(i int, key string) (Value, bool) {
	if i < len(c.args) {
		return c.args[i], true
	}
	v, ok := c.kw[key]
	return v, ok
}

type filterFunc func(r *renderer, c filterCall) (Value, error)

// filters are the Jinja2 filters HF chat templates use, by name.
var filters map[string]filterFunc

// The table is filled in init because "map" applies filters through
// applyFilter, which reads the table: as a variable initialiser that is an
// initialisation cycle.
func init() {
	filters = map[string]filterFunc{
		"length":     filterLength,
		"count":      filterLength,
		"trim":       filterTrim,
		"string":     stringFilter(func(s string) string { return s }),
		"safe":       func(_ *renderer, c filterCall) (Value, error) { return c.x, nil },
		"e":          stringFilter(htmlEscape),
		"escape":     stringFilter(htmlEscape),
		"lower":      stringFilter(strings.ToLower),
		"upper":      stringFilter(strings.ToUpper),
		"title":      stringFilter(title),
		"capitalize": stringFilter(capitalize),
		"tojson":     filterToJSON,
		"first":      endFilter(false),
		"last":       endFilter(true),
		"join":       filterJoin,
		"default":    filterDefault,
		"d":          filterDefault,
		"list":       func(_ *renderer, c filterCall) (Value, error) { return iterate(c.x) },
		"items":      filterItems,
		"reverse":    filterReverse,
		"replace":    filterReplace,
		"int":        filterInt,
		"float":      filterFloat,
		"abs":        filterAbs,
		"indent":     filterIndent,
		"map":        filterMap,
		"selectattr": selectFilter,
		"rejectattr": selectFilter,
		"select":     selectFilter,
		"reject":     selectFilter,
		"unique":     filterUnique,
		"sum":        filterSum,
	}
}

// stringFilter is a filter of the value's string form.
func stringFilter(f func(string) string) filterFunc {
	return func(_ *renderer, c filterCall) (Value, error) { return f(str(c.x)), nil }
}

func filterLength(_ *renderer, c filterCall) (Value, error) {
	switch v := c.x.(type) {
	case string:
		return int64(runeLen(v)), nil
	case []Value:
		return int64(len(v)), nil
	case *Dict:
		return int64(v.Len()), nil
	case Undefined:
		return int64(0), nil
	}
	return nil, errorf("object of type %s has no length", typeName(c.x))
}

func filterTrim(_ *renderer, c filterCall) (Value, error) {
	chars, ok := c.arg(0, "chars")
	return pyStrip(str(c.x), "strip", str(chars), ok && chars != nil), nil
}

func filterToJSON(_ *renderer, c filterCall) (Value, error) {
	indent, _ := c.arg(0, "indent")
	n, _ := asInt(indent)
	return toJSON(c.x, int(max(0, min(n, maxIndent))))
}

// endFilter is "first", or "last" when last is set.
func endFilter(last bool) filterFunc {
	return func(_ *renderer, c filterCall) (Value, error) {
		items, err := iterate(c.x)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return Undefined{}, nil
		}
		if last {
			return items[len(items)-1], nil
		}
		return items[0], nil
	}
}

func filterJoin(_ *renderer, c filterCall) (Value, error) {
	sep, _ := c.arg(0, "d")
	attr, hasAttr := c.arg(1, "attribute")
	items, err := iterate(c.x)
	if err != nil {
		return nil, err
	}
	parts := make([]string, len(items))
	for i, it := range items {
		if hasAttr {
			it = getAttr(it, str(attr))
		}
		parts[i] = str(it)
	}
	if sep == nil {
		sep = ""
	}
	return strings.Join(parts, str(sep)), nil
}

func filterDefault(_ *renderer, c filterCall) (Value, error) {
	def, _ := c.arg(0, "default_value")
	boolean, _ := c.arg(1, "boolean")
	if _, undef := c.x.(Undefined); undef || (truthy(boolean) && !truthy(c.x)) {
		if def == nil && len(c.args) == 0 {
			return "", nil
		}
		return def, nil
	}
	return c.x, nil
}

func filterItems(_ *renderer, c filterCall) (Value, error) {
	if d, ok := c.x.(*Dict); ok {
		return dictItems(d), nil
	}
	if _, ok := c.x.(Undefined); ok {
		return []Value{}, nil
	}
	return nil, errorf("items filter needs a mapping")
}

func filterReverse(_ *renderer, c filterCall) (Value, error) {
	switch v := c.x.(type) {
	case string:
		rs := []rune(v)
		slices.Reverse(rs)
		return string(rs), nil
	default:
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		out := slices.Clone(items)
		slices.Reverse(out)
		return out, nil
	}
}

func filterReplace(_ *renderer, c filterCall) (Value, error) {
	if len(c.args) < 2 {
		return nil, errorf("replace filter needs two arguments")
	}
	return strings.ReplaceAll(str(c.x), str(c.args[0]), str(c.args[1])), nil
}

func filterInt(_ *renderer, c filterCall) (Value, error) {
	switch v := c.x.(type) {
	case int64:
		return v, nil
	case float64:
		return int64(v), nil
	case bool:
		n, _ := asInt(v)
		return n, nil
	case string:
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			return n, nil
		}
	}
	return int64(0), nil
}

func filterFloat(_ *renderer, c filterCall) (Value, error) {
	if f, ok := number(c.x); ok {
		return f, nil
	}
	if f, err := strconv.ParseFloat(strings.TrimSpace(str(c.x)), 64); err == nil {
		return f, nil
	}
	return 0.0, nil
}

func filterAbs(_ *renderer, c filterCall) (Value, error) {
	switch v := c.x.(type) {
	case int64:
		return max(v, -v), nil
	case float64:
		if v < 0 {
			return -v, nil
		}
		return v, nil
	}
	return nil, errorf("abs needs a number")
}

func filterIndent(_ *renderer, c filterCall) (Value, error) {
	width, ok := c.arg(0, "width")
	w, _ := asInt(width)
	if !ok {
		w = 4
	}
	w = max(0, min(w, maxIndent))
	first, _ := c.arg(1, "first")
	pad := strings.Repeat(" ", int(w))
	lines := strings.Split(str(c.x), "\n")
	for i := range lines {
		if (i > 0 || truthy(first)) && lines[i] != "" {
			lines[i] = pad + lines[i]
		}
	}
	return strings.Join(lines, "\n"), nil
}

func filterMap(r *renderer, c filterCall) (Value, error) {
	items, err := iterate(c.x)
	if err != nil {
		return nil, err
	}
	out := make([]Value, len(items))
	attr, hasAttr := c.kw["attribute"]
	for i, it := range items {
		switch {
		case hasAttr:
			out[i] = getAttr(it, str(attr))
		case len(c.args) > 0:
			v, err := r.applyFilter(str(c.args[0]), it, c.args[1:], nil)
			if err != nil {
				return nil, err
			}
			out[i] = v
		default:
			return nil, errorf("map needs a filter name or attribute=")
		}
	}
	return out, nil
}

// selectFilter is select, reject, selectattr and rejectattr, told apart by
// the name they are called by.
func selectFilter(_ *renderer, c filterCall) (Value, error) {
	items, err := iterate(c.x)
	if err != nil {
		return nil, err
	}
	byAttr := strings.HasSuffix(c.name, "attr")
	want := !strings.HasPrefix(c.name, "reject")
	rest := c.args
	if byAttr {
		if len(c.args) == 0 {
			return nil, errorf("%s needs an attribute", c.name)
		}
		rest = c.args[1:]
	}
	var out []Value
	for _, it := range items {
		v := it
		if byAttr {
			v = getAttr(it, str(c.args[0]))
		}
		ok := truthy(v)
		if len(rest) > 0 {
			if ok, err = runTest(str(rest[0]), v, rest[1:]); err != nil {
				return nil, err
			}
		}
		if ok == want {
			out = append(out, it)
		}
	}
	return out, nil
}

func filterUnique(_ *renderer, c filterCall) (Value, error) {
	items, err := iterate(c.x)
	if err != nil {
		return nil, err
	}
	var out []Value
	for _, it := range items {
		if !slices.ContainsFunc(out, func(o Value) bool { return equal(o, it) }) {
			out = append(out, it)
		}
	}
	return out, nil
}

func filterSum(_ *renderer, c filterCall) (Value, error) {
	items, err := iterate(c.x)
	if err != nil {
		return nil, err
	}
	var acc Value = int64(0)
	for _, it := range items {
		if acc, err = arith("+", acc, it); err != nil {
			return nil, err
		}
	}
	return acc, nil
}

// maxIndent bounds indent widths so that output stays proportional to input.
const maxIndent = 64

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(s)
}

func (r *renderer) evalTest(e testExpr) (Value, error) {
	x, err := r.eval(e.x)
	if err != nil {
		return nil, err
	}
	args, _, err := r.evalArgs(e.args, nil, nil)
	if err != nil {
		return nil, err
	}
	ok, err := runTest(e.name, x, args)
	if err != nil {
		return nil, err
	}
	return ok != e.negate, nil
}

func runTest(name string, x Value, args []Value) (bool, error) {
	_, undef := x.(Undefined)
	switch name {
	case "defined":
		return !undef, nil
	case "undefined":
		return undef, nil
	case "none":
		return x == nil, nil
	case "string":
		_, ok := x.(string)
		return ok, nil
	case "number":
		switch x.(type) {
		case int64, float64:
			return true, nil
		}
		return false, nil
	case "integer":
		_, ok := x.(int64)
		return ok, nil
	case "float":
		_, ok := x.(float64)
		return ok, nil
	case "boolean":
		_, ok := x.(bool)
		return ok, nil
	case "true", "false":
		b, ok := x.(bool)
		return ok && b == (name == "true"), nil
	case "mapping":
		_, ok := x.(*Dict)
		return ok, nil
	case "sequence", "iterable":
		switch x.(type) {
		case []Value, string, *Dict:
			return true, nil
		}
		return false, nil
	case "callable":
		_, ok := x.(callable)
		return ok, nil
	case "odd", "even":
		n, ok := asInt(x)
		return ok && (n%2 != 0) == (name == "odd"), nil
	case "divisibleby":
		n, ok := asInt(x)
		if len(args) == 0 {
			return false, errorf("divisibleby needs an argument")
		}
		d, ok2 := asInt(args[0])
		return ok && ok2 && d != 0 && n%d == 0, nil
	case "lower", "upper":
		s, ok := x.(string)
		return ok && strPredicate(s, "is"+name), nil
	}
	if len(args) == 0 {
		return false, errorf("unknown test %q", name)
	}
	switch name {
	case "eq", "equalto", "==", "sameas":
		return equal(x, args[0]), nil
	case "ne", "!=":
		return !equal(x, args[0]), nil
	case "in":
		return contains(args[0], x)
	case "lt", "gt", "le", "ge", "<", ">", "<=", ">=", "lessthan", "greaterthan":
		c, err := compare(x, args[0])
		if err != nil {
			return false, err
		}
		switch name {
		case "lt", "<", "lessthan":
			return c < 0, nil
		case "gt", ">", "greaterthan":
			return c > 0, nil
		case "le", "<=":
			return c <= 0, nil
		}
		return c >= 0, nil
	}
	return false, errorf("unknown test %q", name)
}
