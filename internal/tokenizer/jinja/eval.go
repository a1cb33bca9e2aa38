package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Error is a failure while rendering (a type error, a missing filter, a
// limit hit).
type Error struct {
	Msg string
}

func (e *Error) Error() string { return "jinja: " + e.Msg }

// RaisedError is returned when the template calls raise_exception; Message
// is the template's text, meant for the API client (vLLM answers 400).
type RaisedError struct {
	Message string
}

func (e *RaisedError) Error() string { return "jinja: template raised: " + e.Message }

// Limits on one Render call.
const (
	MaxOutputBytes = 64 << 20
	maxIterations  = 1 << 20
	maxCallDepth   = 64
)

func errorf(format string, args ...any) error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// loop control signals travel as errors up to the enclosing for.
var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

type renderer struct {
	out        strings.Builder
	scopes     []map[string]Value
	iterations int
	depth      int
}

// Render renders the template with vars as its top-level variables; values
// are converted with FromGo.
func (t *Template) Render(vars map[string]any) (string, error) {
	r := &renderer{}
	top := make(map[string]Value, len(vars))
	for k, v := range vars {
		top[k] = FromGo(v)
	}
	r.scopes = []map[string]Value{globals(), top}
	if err := r.exec(t.body); err != nil {
		if errors.Is(err, errBreak) || errors.Is(err, errContinue) {
			return "", errorf("break or continue outside a loop")
		}
		return "", err
	}
	return r.out.String(), nil
}

func (r *renderer) lookup(name string) Value {
	for i := len(r.scopes) - 1; i >= 0; i-- {
		if v, ok := r.scopes[i][name]; ok {
			return v
		}
	}
	return Undefined{Name: name}
}

func (r *renderer) setVar(name string, v Value) { r.scopes[len(r.scopes)-1][name] = v }

func (r *renderer) write(s string) error {
	if r.out.Len()+len(s) > MaxOutputBytes {
		return errorf("output exceeds %d bytes", MaxOutputBytes)
	}
	r.out.WriteString(s)
	return nil
}

func (r *renderer) exec(body []node) error {
	for _, n := range body {
		if err := r.execNode(n); err != nil {
			return err
		}
	}
	return nil
}

func (r *renderer) execNode(n node) error {
	switch n := n.(type) {
	case textNode:
		return r.write(n.s)
	case outputNode:
		v, err := r.eval(n.e)
		if err != nil {
			return err
		}
		return r.write(str(v))
	case ifNode:
		for i, c := range n.conds {
			v, err := r.eval(c)
			if err != nil {
				return err
			}
			if truthy(v) {
				return r.exec(n.bodies[i])
			}
		}
		return r.exec(n.els)
	case forNode:
		return r.execFor(n)
	case setNode:
		return r.execSet(n)
	case macroNode:
		r.setVar(n.name, r.macro(n))
		return nil
	case loopCtlNode:
		if n.brk {
			return errBreak
		}
		return errContinue
	}
	return errorf("unknown node %T", n)
}

func (r *renderer) execSet(n setNode) error {
	var v Value
	if n.body != nil || n.e == nil {
		// Block set captures its rendered body.
		saved := r.out
		r.out = strings.Builder{}
		err := r.exec(n.body)
		v = r.out.String()
		r.out = saved
		if err != nil {
			return err
		}
	} else {
		var err error
		if v, err = r.eval(n.e); err != nil {
			return err
		}
	}
	switch {
	case n.attr != "":
		ns, ok := r.lookup(n.targets[0]).(*Dict)
		if !ok || !ns.namespace {
			return errorf("cannot assign attribute %s on %s, which is not a namespace", n.attr, n.targets[0])
		}
		ns.Set(n.attr, v)
	case len(n.targets) == 1:
		r.setVar(n.targets[0], v)
	default:
		items, err := unpack(v, len(n.targets))
		if err != nil {
			return err
		}
		for i, t := range n.targets {
			r.setVar(t, items[i])
		}
	}
	return nil
}

func unpack(v Value, n int) ([]Value, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) != n {
		return nil, errorf("cannot unpack %d values into %d names", len(items), n)
	}
	return items, nil
}

// iterate lists the elements a for loop visits: list items, dict keys or
// string characters.
func iterate(v Value) ([]Value, error) {
	switch x := v.(type) {
	case []Value:
		return x, nil
	case *Dict:
		out := make([]Value, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	case string:
		out := make([]Value, 0, len(x))
		for _, c := range x {
			out = append(out, string(c))
		}
		return out, nil
	case Undefined, nil:
		if _, ok := x.(Undefined); ok {
			return nil, nil // Jinja iterates an undefined value as empty
		}
	}
	return nil, errorf("%s is not iterable", typeName(v))
}

func (r *renderer) execFor(n forNode) error {
	seq, err := r.eval(n.iter)
	if err != nil {
		return err
	}
	items, err := iterate(seq)
	if err != nil {
		return err
	}
	scope := map[string]Value{}
	r.scopes = append(r.scopes, scope)
	defer func() { r.scopes = r.scopes[:len(r.scopes)-1] }()
	bind := func(item Value) error {
		if len(n.targets) == 1 {
			scope[n.targets[0]] = item
			return nil
		}
		vals, err := unpack(item, len(n.targets))
		if err != nil {
			return err
		}
		for i, t := range n.targets {
			scope[t] = vals[i]
		}
		return nil
	}
	if n.cond != nil { // the inline filter runs before loop.* is computed
		var kept []Value
		for _, it := range items {
			if err := bind(it); err != nil {
				return err
			}
			ok, err := r.eval(n.cond)
			if err != nil {
				return err
			}
			if truthy(ok) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		return r.exec(n.els)
	}
	for i, it := range items {
		if r.iterations++; r.iterations > maxIterations {
			return errorf("more than %d loop iterations", maxIterations)
		}
		clear(scope)
		if err := bind(it); err != nil {
			return err
		}
		loop := NewDict()
		loop.Set("index", int64(i+1))
		loop.Set("index0", int64(i))
		loop.Set("revindex", int64(len(items)-i))
		loop.Set("revindex0", int64(len(items)-i-1))
		loop.Set("first", i == 0)
		loop.Set("last", i == len(items)-1)
		loop.Set("length", int64(len(items)))
		loop.Set("depth", int64(1))
		loop.Set("depth0", int64(0))
		if i > 0 {
			loop.Set("previtem", items[i-1])
		}
		if i+1 < len(items) {
			loop.Set("nextitem", items[i+1])
		}
		loop.Set("cycle", callable(func(_ *renderer, args []Value, _ map[string]Value) (Value, error) {
			if len(args) == 0 {
				return nil, errorf("loop.cycle needs arguments")
			}
			return args[i%len(args)], nil
		}))
		scope["loop"] = loop
		err := r.exec(n.body)
		switch {
		case errors.Is(err, errBreak):
			return nil
		case errors.Is(err, errContinue):
		case err != nil:
			return err
		}
	}
	return nil
}

// macro makes a callable that renders the macro body in a fresh scope.
func (r *renderer) macro(n macroNode) callable {
	return func(r *renderer, args []Value, kw map[string]Value) (Value, error) {
		if len(args) > len(n.params) {
			return nil, errorf("macro %s takes %d arguments, got %d", n.name, len(n.params), len(args))
		}
		if r.depth++; r.depth > maxCallDepth {
			return nil, errorf("macro calls nested deeper than %d", maxCallDepth)
		}
		defer func() { r.depth-- }()
		scope := map[string]Value{}
		for i, p := range n.params {
			if i < len(args) {
				scope[p] = args[i]
				continue
			}
			if v, ok := kw[p]; ok {
				scope[p] = v
				continue
			}
			if n.defaults[i] == nil {
				scope[p] = Undefined{Name: p}
				continue
			}
			v, err := r.eval(n.defaults[i])
			if err != nil {
				return nil, err
			}
			scope[p] = v
		}
		// Macros see globals and the template's top level, not the
		// caller's loop variables.
		saved := r.scopes
		r.scopes = append(append([]map[string]Value{}, saved[:2]...), scope)
		savedOut := r.out
		r.out = strings.Builder{}
		err := r.exec(n.body)
		s := r.out.String()
		r.out, r.scopes = savedOut, saved
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

func (r *renderer) eval(e expr) (Value, error) {
	switch e := e.(type) {
	case constExpr:
		return e.v, nil
	case nameExpr:
		return r.lookup(e.name), nil
	case listExpr:
		out := make([]Value, len(e.items))
		for i, it := range e.items {
			v, err := r.eval(it)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case dictExpr:
		d := NewDict()
		for i := range e.keys {
			k, err := r.eval(e.keys[i])
			if err != nil {
				return nil, err
			}
			v, err := r.eval(e.vals[i])
			if err != nil {
				return nil, err
			}
			d.Set(str(k), v)
		}
		return d, nil
	case attrExpr:
		obj, err := r.eval(e.obj)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.name), nil
	case indexExpr:
		obj, err := r.eval(e.obj)
		if err != nil {
			return nil, err
		}
		idx, err := r.eval(e.index)
		if err != nil {
			return nil, err
		}
		return getItem(obj, idx)
	case sliceExpr:
		return r.evalSlice(e)
	case callExpr:
		return r.evalCall(e)
	case filterExpr:
		return r.evalFilter(e)
	case testExpr:
		return r.evalTest(e)
	case unaryExpr:
		x, err := r.eval(e.x)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "not":
			return !truthy(x), nil
		case "-":
			switch v := x.(type) {
			case int64:
				return -v, nil
			case float64:
				return -v, nil
			}
			return nil, errorf("bad operand type for unary -: %s", typeName(x))
		}
		return x, nil
	case binExpr:
		return r.evalBinary(e)
	case condExpr:
		c, err := r.eval(e.cond)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(e.a)
		}
		if e.b == nil {
			return Undefined{}, nil
		}
		return r.eval(e.b)
	}
	return nil, errorf("unknown expression %T", e)
}

func getAttr(obj Value, name string) Value {
	if d, ok := obj.(*Dict); ok {
		if v, ok := d.m[name]; ok {
			return v
		}
	}
	if m := method(obj, name); m != nil {
		return m
	}
	return Undefined{Name: name}
}

func getItem(obj, idx Value) (Value, error) {
	switch x := obj.(type) {
	case *Dict:
		if v, ok := x.m[str(idx)]; ok {
			return v, nil
		}
		return Undefined{Name: str(idx)}, nil
	case []Value:
		i, ok := idx.(int64)
		if !ok {
			return nil, errorf("list indices must be integers, not %s", typeName(idx))
		}
		if i < 0 {
			i += int64(len(x))
		}
		if i < 0 || i >= int64(len(x)) {
			return Undefined{}, nil
		}
		return x[i], nil
	case string:
		i, ok := idx.(int64)
		if !ok {
			return nil, errorf("string indices must be integers")
		}
		rs := []rune(x)
		if i < 0 {
			i += int64(len(rs))
		}
		if i < 0 || i >= int64(len(rs)) {
			return Undefined{}, nil
		}
		return string(rs[i]), nil
	case Undefined:
		return Undefined{}, nil
	}
	if s, ok := idx.(string); ok {
		return getAttr(obj, s), nil
	}
	return nil, errorf("%s is not subscriptable", typeName(obj))
}

func (r *renderer) evalSlice(e sliceExpr) (Value, error) {
	obj, err := r.eval(e.obj)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, part := range []expr{e.lo, e.hi, e.step} {
		if part == nil {
			continue
		}
		v, err := r.eval(part)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := v.(int64)
		if !ok {
			return nil, errorf("slice indices must be integers")
		}
		bounds[i] = &n
	}
	var n int
	var pick func(idx []int) Value
	switch x := obj.(type) {
	case []Value:
		n = len(x)
		pick = func(idx []int) Value {
			out := make([]Value, len(idx))
			for i, j := range idx {
				out[i] = x[j]
			}
			return out
		}
	case string:
		rs := []rune(x)
		n = len(rs)
		pick = func(idx []int) Value {
			out := make([]rune, len(idx))
			for i, j := range idx {
				out[i] = rs[j]
			}
			return string(out)
		}
	default:
		return nil, errorf("%s cannot be sliced", typeName(obj))
	}
	idx, err := sliceIndices(n, bounds)
	if err != nil {
		return nil, err
	}
	return pick(idx), nil
}

// sliceIndices implements Python's slice semantics.
func sliceIndices(n int, b [3]*int64) ([]int, error) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return nil, errorf("slice step cannot be zero")
	}
	clamp := func(p *int64, def int64, lo, hi int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += int64(n)
		}
		return max(lo, min(hi, v))
	}
	var idx []int
	if step > 0 {
		start, stop := clamp(b[0], 0, 0, int64(n)), clamp(b[1], int64(n), 0, int64(n))
		for i := start; i < stop; i += step {
			idx = append(idx, int(i))
			if step > stop-i { // the next index is past stop (and may overflow)
				break
			}
		}
	} else {
		start, stop := clamp(b[0], int64(n)-1, -1, int64(n)-1), clamp(b[1], -1, -1, int64(n)-1)
		if b[1] == nil {
			stop = -1
		}
		for i := start; i > stop; i += step {
			idx = append(idx, int(i))
		}
	}
	return idx, nil
}

func (r *renderer) evalArgs(args []expr, kwName []string, kwVal []expr) ([]Value, map[string]Value, error) {
	vals := make([]Value, len(args))
	for i, a := range args {
		v, err := r.eval(a)
		if err != nil {
			return nil, nil, err
		}
		vals[i] = v
	}
	var kw map[string]Value
	if len(kwName) > 0 {
		kw = make(map[string]Value, len(kwName))
		for i, k := range kwName {
			v, err := r.eval(kwVal[i])
			if err != nil {
				return nil, nil, err
			}
			kw[k] = v
		}
	}
	return vals, kw, nil
}

func (r *renderer) evalCall(e callExpr) (Value, error) {
	fn, err := r.eval(e.fn)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(e.args, e.kwName, e.kwVal)
	if err != nil {
		return nil, err
	}
	c, ok := fn.(callable)
	if !ok {
		if u, isU := fn.(Undefined); isU {
			return nil, errorf("%s is undefined and cannot be called", u.Name)
		}
		return nil, errorf("%s is not callable", typeName(fn))
	}
	return c(r, args, kw)
}

func (r *renderer) evalBinary(e binExpr) (Value, error) {
	l, err := r.eval(e.l)
	if err != nil {
		return nil, err
	}
	switch e.op { // short-circuit operators return an operand, as in Python
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return r.eval(e.r)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return r.eval(e.r)
	}
	rv, err := r.eval(e.r)
	if err != nil {
		return nil, err
	}
	return binary(e.op, l, rv)
}

func binary(op string, l, r Value) (Value, error) {
	switch op {
	case "~":
		return str(l) + str(r), nil
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "in", "not in":
		in, err := contains(r, l)
		if err != nil {
			return nil, err
		}
		return in == (op == "in"), nil
	case "<", ">", "<=", ">=":
		c, err := compare(l, r)
		if err != nil {
			return nil, err
		}
		switch op {
		case "<":
			return c < 0, nil
		case ">":
			return c > 0, nil
		case "<=":
			return c <= 0, nil
		}
		return c >= 0, nil
	case "+":
		switch x := l.(type) {
		case string:
			if y, ok := r.(string); ok {
				return x + y, nil
			}
		case []Value:
			if y, ok := r.([]Value); ok {
				return append(append([]Value{}, x...), y...), nil
			}
		}
	case "*":
		if s, ok := l.(string); ok {
			if n, ok := r.(int64); ok {
				if n <= 0 {
					return "", nil
				}
				if len(s) > 0 && n > MaxOutputBytes/int64(len(s)) {
					return nil, errorf("string repetition too large")
				}
				return strings.Repeat(s, int(n)), nil
			}
		}
	}
	return arith(op, l, r)
}

func arith(op string, l, r Value) (Value, error) {
	li, lInt := asInt(l)
	ri, rInt := asInt(r)
	lf, lok := number(l)
	rf, rok := number(r)
	if !lok || !rok {
		return nil, errorf("unsupported operand types for %s: %s and %s", op, typeName(l), typeName(r))
	}
	if lInt && rInt {
		switch op {
		case "+":
			return li + ri, nil
		case "-":
			return li - ri, nil
		case "*":
			return li * ri, nil
		case "//", "%":
			if ri == 0 {
				return nil, errorf("integer division or modulo by zero")
			}
			q, m := li/ri, li%ri
			if m != 0 && (m < 0) != (ri < 0) { // Python floors
				q--
				m += ri
			}
			if op == "//" {
				return q, nil
			}
			return m, nil
		case "**":
			if ri >= 0 {
				out := int64(1)
				for i := int64(0); i < ri && i < 64; i++ {
					out *= li
				}
				return out, nil
			}
		}
	}
	switch op {
	case "+":
		return lf + rf, nil
	case "-":
		return lf - rf, nil
	case "*":
		return lf * rf, nil
	case "/":
		if rf == 0 {
			return nil, errorf("division by zero")
		}
		return lf / rf, nil
	case "//":
		if rf == 0 {
			return nil, errorf("division by zero")
		}
		return math.Floor(lf / rf), nil
	case "%":
		if rf == 0 {
			return nil, errorf("modulo by zero")
		}
		m := math.Mod(lf, rf)
		if m != 0 && (m < 0) != (rf < 0) {
			m += rf
		}
		return m, nil
	case "**":
		return math.Pow(lf, rf), nil
	}
	return nil, errorf("unknown operator %s", op)
}

func asInt(v Value) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

func compare(l, r Value) (int, error) {
	if lf, ok := number(l); ok {
		if rf, ok := number(r); ok {
			switch {
			case lf < rf:
				return -1, nil
			case lf > rf:
				return 1, nil
			}
			return 0, nil
		}
	}
	if ls, ok := l.(string); ok {
		if rs, ok := r.(string); ok {
			return strings.Compare(ls, rs), nil
		}
	}
	return 0, errorf("cannot compare %s with %s", typeName(l), typeName(r))
}

// contains is Python's "needle in container".
func contains(container, needle Value) (bool, error) {
	switch c := container.(type) {
	case string:
		n, ok := needle.(string)
		if !ok {
			return false, errorf("'in <string>' requires a string, not %s", typeName(needle))
		}
		return strings.Contains(c, n), nil
	case []Value:
		for _, it := range c {
			if equal(it, needle) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		s, ok := needle.(string)
		if !ok {
			return false, nil
		}
		_, in := c.m[s]
		return in, nil
	case Undefined:
		return false, nil
	}
	return false, errorf("argument of type %s is not iterable", typeName(container))
}

func runeLen(s string) int { return utf8.RuneCountInString(s) }
