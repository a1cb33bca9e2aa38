package jinja

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Value is a template value: nil (None), bool, int64, float64, string,
// []Value, *Dict, Undefined or a callable.
type Value = any

// Undefined is the value of a missing variable or attribute. It prints as
// the empty string and is falsy, like Jinja's default Undefined.
type Undefined struct{ Name string }

// Dict is an insertion-ordered string-keyed mapping (Python dicts keep
// insertion order, which tojson output depends on).
type Dict struct {
	keys []string
	m    map[string]Value
	// namespace marks objects made by namespace(), whose attributes a set
	// statement may assign.
	namespace bool
}

// NewDict returns an empty Dict.
func NewDict() *Dict { return &Dict{m: map[string]Value{}} }

// Set adds or replaces a key, keeping its first insertion position.
func (d *Dict) Set(k string, v Value) {
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

// Get returns the value for k.
func (d *Dict) Get(k string) (Value, bool) {
	v, ok := d.m[k]
	return v, ok
}

// Len is the number of keys.
func (d *Dict) Len() int { return len(d.keys) }

// callable is a function value: a global, a bound method or a macro.
type callable func(r *renderer, args []Value, kw map[string]Value) (Value, error)

// FromGo converts Go data (maps, slices, numbers, strings, bools, nil) into
// template values. Maps with string keys become Dicts with sorted keys;
// use *Dict directly to control key order.
func FromGo(v any) Value {
	switch x := v.(type) {
	case nil, bool, int64, float64, string, *Dict, Undefined:
		return x
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case []Value:
		out := make([]Value, len(x))
		for i, e := range x {
			out[i] = FromGo(e)
		}
		return out
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := NewDict()
		for _, k := range keys {
			d.Set(k, FromGo(x[k]))
		}
		return d
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		out := make([]Value, rv.Len())
		for i := range out {
			out[i] = FromGo(rv.Index(i).Interface())
		}
		return out
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int64(rv.Uint())
	case reflect.String:
		return rv.String()
	case reflect.Bool:
		return rv.Bool()
	case reflect.Map:
		if rv.Type().Key().Kind() == reflect.String {
			m := make(map[string]any, rv.Len())
			for it := rv.MapRange(); it.Next(); {
				m[it.Key().String()] = it.Value().Interface()
			}
			return FromGo(m)
		}
	}
	return fmt.Sprint(v)
}

func truthy(v Value) bool {
	switch x := v.(type) {
	case nil, Undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []Value:
		return len(x) > 0
	case *Dict:
		return x.Len() > 0
	}
	return true
}

// str is Python's str().
func str(v Value) string {
	switch x := v.(type) {
	case string:
		return x
	case Undefined:
		return ""
	}
	return repr(v)
}

// repr is Python's repr(), which str() of containers uses for elements.
func repr(v Value) string { return reprDepth(v, 0) }

func reprDepth(v Value, depth int) string {
	if depth > maxNesting {
		return "..." // a namespace that contains itself
	}
	switch x := v.(type) {
	case nil:
		return "None"
	case Undefined:
		return ""
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return pyFloat(x)
	case string:
		return pyQuote(x)
	case []Value:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = reprDepth(e, depth+1)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case *Dict:
		parts := make([]string, len(x.keys))
		for i, k := range x.keys {
			parts[i] = pyQuote(k) + ": " + reprDepth(x.m[k], depth+1)
		}
		if x.namespace {
			return "<Namespace {" + strings.Join(parts, ", ") + "}>"
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case callable:
		return "<function>"
	}
	return fmt.Sprint(v)
}

func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	case f == math.Trunc(f) && math.Abs(f) < 1e16:
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if strings.Contains(s, "e") {
		// Python writes exponents with at least two digits: 1e-05.
		mant, exp, _ := strings.Cut(s, "e")
		sign := exp[0]
		digits := exp[1:]
		if len(digits) < 2 {
			digits = "0" + digits
		}
		return mant + "e" + string(sign) + digits
	}
	return s
}

// pyQuote quotes like Python's repr of a str.
func pyQuote(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// equal is Python ==.
func equal(a, b Value) bool { return equalDepth(a, b, 0) }

func equalDepth(a, b Value, depth int) bool {
	if depth > maxNesting {
		return false
	}
	if fa, ok := number(a); ok {
		if fb, ok := number(b); ok {
			return fa == fb
		}
		return false
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		y, ok := b.(string)
		return ok && x == y
	case Undefined:
		_, ok := b.(Undefined)
		return ok
	case []Value:
		y, ok := b.([]Value)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalDepth(x[i], y[i], depth+1) {
				return false
			}
		}
		return true
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for _, k := range x.keys {
			w, ok := y.m[k]
			if !ok || !equalDepth(x.m[k], w, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

// number returns v as float64 when it is a bool, int or float (Python
// treats bools as ints in arithmetic and comparison).
func number(v Value) (float64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

func typeName(v Value) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case Undefined:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []Value:
		return "list"
	case *Dict:
		return "dict"
	case callable:
		return "function"
	}
	return fmt.Sprintf("%T", v)
}
