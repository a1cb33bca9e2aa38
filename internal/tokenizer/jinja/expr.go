package jinja

import "fmt"

// Expression nodes.
type expr interface{}

type (
	constExpr struct{ v Value }
	nameExpr  struct{ name string }
	listExpr  struct{ items []expr }
	dictExpr  struct{ keys, vals []expr }
	attrExpr  struct {
		obj  expr
		name string
	}
	indexExpr struct{ obj, index expr }
	sliceExpr struct{ obj, lo, hi, step expr }
	callExpr  struct {
		fn     expr
		args   []expr
		kwName []string
		kwVal  []expr
	}
	filterExpr struct {
		x      expr
		name   string
		args   []expr
		kwName []string
		kwVal  []expr
	}
	testExpr struct {
		x      expr
		name   string
		args   []expr
		negate bool
	}
	unaryExpr struct {
		op string
		x  expr
	}
	binExpr struct {
		op   string
		l, r expr
	}
	condExpr struct{ cond, a, b expr }
)

type exprParser struct {
	toks  []token
	pos   int
	line  int
	depth int
}

func newExprParser(src string, line int) (*exprParser, error) {
	toks, err := lexExpr(src, line)
	if err != nil {
		return nil, err
	}
	return &exprParser{toks: toks, line: line}, nil
}

func (p *exprParser) peek() token { return p.toks[p.pos] }

func (p *exprParser) next() token {
	t := p.toks[p.pos]
	if t.kind != tkEOF {
		p.pos++
	}
	return t
}

func (p *exprParser) isOp(op string) bool {
	t := p.peek()
	return t.kind == tkOp && t.s == op
}

func (p *exprParser) acceptOp(op string) bool {
	if p.isOp(op) {
		p.pos++
		return true
	}
	return false
}

func (p *exprParser) isName(n string) bool {
	t := p.peek()
	return t.kind == tkName && t.s == n
}

func (p *exprParser) acceptName(n string) bool {
	if p.isName(n) {
		p.pos++
		return true
	}
	return false
}

func (p *exprParser) errorf(format string, args ...any) error {
	return &SyntaxError{Line: p.line, Msg: fmt.Sprintf(format, args...)}
}

func (p *exprParser) expectOp(op string) error {
	if !p.acceptOp(op) {
		return p.errorf("expected %q, found %s", op, describe(p.peek()))
	}
	return nil
}

func (p *exprParser) expectEOF() error {
	if t := p.peek(); t.kind != tkEOF {
		return p.errorf("unexpected %s", describe(t))
	}
	return nil
}

func describe(t token) string {
	switch t.kind {
	case tkEOF:
		return "end of tag"
	case tkString:
		return fmt.Sprintf("string %q", t.s)
	case tkInt:
		return fmt.Sprint(t.i)
	case tkFloat:
		return fmt.Sprint(t.f)
	}
	return fmt.Sprintf("%q", t.s)
}

func (p *exprParser) enter() error {
	p.depth++
	if p.depth > maxNesting {
		return p.errorf("expression nesting too deep")
	}
	return nil
}

// parseTuple parses "a, b" (an implicit tuple, as in set a, b = 1, 2) or a
// single expression.
func (p *exprParser) parseTuple() (expr, error) {
	e, err := p.parseExpr()
	if err != nil || !p.isOp(",") {
		return e, err
	}
	items := []expr{e}
	for p.acceptOp(",") {
		if p.peek().kind == tkEOF {
			break
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return listExpr{items}, nil
}

// parseExpr parses a full expression including "a if c else b".
func (p *exprParser) parseExpr() (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.acceptName("if") {
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var other expr
		if p.acceptName("else") {
			if other, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		e = condExpr{cond: cond, a: e, b: other}
	}
	return e, nil
}

func (p *exprParser) parseOr() (expr, error) {
	return p.leftAssoc(p.parseAnd, func() string { return p.acceptNameOp("or") })
}

func (p *exprParser) parseAnd() (expr, error) {
	return p.leftAssoc(p.parseNot, func() string { return p.acceptNameOp("and") })
}

func (p *exprParser) parseNot() (expr, error) {
	if p.acceptName("not") {
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer func() { p.depth-- }()
		x, err := p.parseNot()
		return unaryExpr{"not", x}, err
	}
	return p.parseCompare()
}

func (p *exprParser) parseCompare() (expr, error) {
	return p.leftAssoc(p.parseMath1, func() string {
		if op := p.acceptAnyOp("==", "!=", "<", ">", "<=", ">="); op != "" {
			return op
		}
		switch {
		case p.acceptName("in"):
			return "in"
		case p.isName("not") && p.pos+1 < len(p.toks) && p.toks[p.pos+1].kind == tkName && p.toks[p.pos+1].s == "in":
			p.pos += 2
			return "not in"
		}
		return ""
	})
}

func (p *exprParser) parseMath1() (expr, error) {
	return p.leftAssoc(p.parseConcat, func() string { return p.acceptAnyOp("+", "-") })
}

func (p *exprParser) parseConcat() (expr, error) {
	return p.leftAssoc(p.parseMath2, func() string { return p.acceptAnyOp("~") })
}

func (p *exprParser) parseMath2() (expr, error) {
	return p.leftAssoc(p.parsePow, func() string { return p.acceptAnyOp("*", "/", "//", "%") })
}

func (p *exprParser) parsePow() (expr, error) {
	return p.leftAssoc(p.parseUnary, func() string { return p.acceptAnyOp("**") })
}

// leftAssoc parses one precedence level of left-associative binary
// operators: operand (op operand)*. accept consumes the operator at the
// cursor and returns it, or returns "" where the level ends.
func (p *exprParser) leftAssoc(operand func() (expr, error), accept func() string) (expr, error) {
	l, err := operand()
	for err == nil {
		op := accept()
		if op == "" {
			break
		}
		var r expr
		if r, err = operand(); err == nil {
			l = binExpr{op, l, r}
		}
	}
	return l, err
}

// acceptAnyOp consumes the operator token at the cursor if it is one of
// ops and returns it; "" otherwise.
func (p *exprParser) acceptAnyOp(ops ...string) string {
	for _, op := range ops {
		if p.acceptOp(op) {
			return op
		}
	}
	return ""
}

// acceptNameOp consumes the keyword operator n at the cursor.
func (p *exprParser) acceptNameOp(n string) string {
	if p.acceptName(n) {
		return n
	}
	return ""
}

func (p *exprParser) parseUnary() (expr, error) {
	if p.isOp("-") || p.isOp("+") {
		op := p.next().s
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer func() { p.depth-- }()
		x, err := p.parseUnary()
		if err != nil {
			return nil, err
		}
		return p.parseFilters(unaryExpr{op, x})
	}
	x, err := p.parsePrimary()
	if err != nil {
		return nil, err
	}
	if x, err = p.parsePostfix(x); err != nil {
		return nil, err
	}
	return p.parseFilters(x)
}

// parseFilters parses "| filter(args)" chains and "is [not] test" suffixes.
func (p *exprParser) parseFilters(x expr) (expr, error) {
	for {
		switch {
		case p.acceptOp("|"):
			name, err := p.dottedName()
			if err != nil {
				return nil, err
			}
			f := filterExpr{x: x, name: name}
			if p.acceptOp("(") {
				if f.args, f.kwName, f.kwVal, err = p.parseArgs(); err != nil {
					return nil, err
				}
			}
			x = f
		case p.acceptName("is"):
			t := testExpr{x: x, negate: p.acceptName("not")}
			tok := p.next()
			if tok.kind != tkName {
				return nil, p.errorf("expected a test name after 'is'")
			}
			t.name = tok.s
			if p.acceptOp("(") {
				args, kw, _, err := p.parseArgs()
				if err != nil {
					return nil, err
				}
				if len(kw) > 0 {
					return nil, p.errorf("keyword arguments to tests are not supported")
				}
				t.args = args
			} else if k := p.peek().kind; k == tkString || k == tkInt || k == tkFloat || (k == tkName && !isKeyword(p.peek().s)) {
				// "is divisibleby 3", "is equalto x": one bare argument.
				arg, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				if arg, err = p.parsePostfix(arg); err != nil {
					return nil, err
				}
				t.args = []expr{arg}
			}
			x = t
		default:
			return x, nil
		}
	}
}

func isKeyword(s string) bool {
	switch s {
	case "and", "or", "not", "in", "is", "if", "else":
		return true
	}
	return false
}

func (p *exprParser) dottedName() (string, error) {
	t := p.next()
	if t.kind != tkName {
		return "", p.errorf("expected a filter name, found %s", describe(t))
	}
	return t.s, nil
}

// parseArgs parses call arguments after "(" up to and including ")".
func (p *exprParser) parseArgs() (args []expr, kwName []string, kwVal []expr, err error) {
	for !p.acceptOp(")") {
		if len(args)+len(kwName) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, nil, nil, err
			}
			if p.acceptOp(")") {
				break
			}
		}
		if t := p.peek(); t.kind == tkName && p.pos+1 < len(p.toks) && p.toks[p.pos+1].kind == tkOp && p.toks[p.pos+1].s == "=" {
			p.pos += 2
			v, err := p.parseExpr()
			if err != nil {
				return nil, nil, nil, err
			}
			kwName, kwVal = append(kwName, t.s), append(kwVal, v)
			continue
		}
		if len(kwName) > 0 {
			return nil, nil, nil, p.errorf("positional argument after keyword argument")
		}
		v, err := p.parseExpr()
		if err != nil {
			return nil, nil, nil, err
		}
		args = append(args, v)
	}
	return args, kwName, kwVal, nil
}

func (p *exprParser) parsePostfix(x expr) (expr, error) {
	for {
		switch {
		case p.acceptOp("."):
			t := p.next()
			switch t.kind {
			case tkName:
				x = attrExpr{obj: x, name: t.s}
			case tkInt:
				x = indexExpr{obj: x, index: constExpr{t.i}}
			default:
				return nil, p.errorf("expected an attribute name after '.'")
			}
		case p.acceptOp("["):
			e, err := p.parseSubscript(x)
			if err != nil {
				return nil, err
			}
			x = e
		case p.acceptOp("("):
			args, kwName, kwVal, err := p.parseArgs()
			if err != nil {
				return nil, err
			}
			x = callExpr{fn: x, args: args, kwName: kwName, kwVal: kwVal}
		default:
			return x, nil
		}
	}
}

func (p *exprParser) parseSubscript(obj expr) (expr, error) {
	var parts [3]expr
	n := 0
	for {
		if !p.isOp(":") && !p.isOp("]") {
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			parts[n] = e
		}
		if p.acceptOp("]") {
			break
		}
		if err := p.expectOp(":"); err != nil {
			return nil, err
		}
		if n++; n > 2 {
			return nil, p.errorf("too many ':' in subscript")
		}
	}
	if n == 0 {
		if parts[0] == nil {
			return nil, p.errorf("empty subscript")
		}
		return indexExpr{obj: obj, index: parts[0]}, nil
	}
	return sliceExpr{obj: obj, lo: parts[0], hi: parts[1], step: parts[2]}, nil
}

func (p *exprParser) parsePrimary() (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	t := p.next()
	switch t.kind {
	case tkString:
		s := t.s
		for p.peek().kind == tkString { // adjacent literals concatenate
			s += p.next().s
		}
		return constExpr{s}, nil
	case tkInt:
		return constExpr{t.i}, nil
	case tkFloat:
		return constExpr{t.f}, nil
	case tkName:
		switch t.s {
		case "true", "True":
			return constExpr{true}, nil
		case "false", "False":
			return constExpr{false}, nil
		case "none", "None":
			return constExpr{nil}, nil
		}
		return nameExpr{t.s}, nil
	case tkOp:
		switch t.s {
		case "(":
			if p.acceptOp(")") {
				return listExpr{}, nil
			}
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			if p.isOp(",") {
				items := []expr{e}
				for p.acceptOp(",") && !p.isOp(")") {
					e, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					items = append(items, e)
				}
				e = listExpr{items}
			}
			return e, p.expectOp(")")
		case "[":
			var items []expr
			for !p.acceptOp("]") {
				if len(items) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.acceptOp("]") {
						break
					}
				}
				e, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				items = append(items, e)
			}
			return listExpr{items}, nil
		case "{":
			var d dictExpr
			for !p.acceptOp("}") {
				if len(d.keys) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.acceptOp("}") {
						break
					}
				}
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
			}
			return d, nil
		}
	}
	return nil, p.errorf("unexpected %s", describe(t))
}
