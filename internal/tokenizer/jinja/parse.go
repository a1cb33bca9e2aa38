package jinja

import (
	"fmt"
	"slices"
)

// Template is a parsed template; it is immutable and safe for concurrent
// Render calls.
type Template struct {
	body []node
}

// Parse parses template source.
func Parse(src string) (*Template, error) {
	segs, err := splitSegments(src)
	if err != nil {
		return nil, err
	}
	p := &stmtParser{segs: segs}
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, &SyntaxError{Line: p.line(), Msg: "unexpected {% " + end + " %}"}
	}
	return &Template{body: body}, nil
}

// Statement nodes.
type node interface{}

type (
	textNode   struct{ s string }
	outputNode struct{ e expr }
	ifNode     struct {
		conds  []expr
		bodies [][]node
		els    []node
	}
	forNode struct {
		targets []string
		iter    expr
		cond    expr // inline "if" filter, may be nil
		body    []node
		els     []node
		line    int
	}
	setNode struct {
		targets []string // one name, or several for tuple unpacking
		attr    string   // set ns.attr = ...
		e       expr
		body    []node // block set when e is nil
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr // per param, nil when required
		body     []node
	}
	loopCtlNode struct{ brk bool }
)

// maxNesting bounds statement and expression nesting so that a hostile
// template cannot overflow the stack.
const maxNesting = 200

type stmtParser struct {
	segs  []segment
	pos   int
	depth int
	// pending holds the rest of the tag that ended the last body (the
	// condition after "elif"), for the caller to parse.
	pending *exprParser
}

func (p *stmtParser) line() int {
	if p.pos < len(p.segs) {
		return p.segs[p.pos].line
	}
	if len(p.segs) > 0 {
		return p.segs[len(p.segs)-1].line
	}
	return 1
}

// parseBody parses nodes until an unmatched end/else-style tag, which it
// consumes and returns by keyword ("" at end of input), leaving its
// remaining tokens in p.pending.
func (p *stmtParser) parseBody() ([]node, string, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxNesting {
		return nil, "", &SyntaxError{Line: p.line(), Msg: "nesting too deep"}
	}
	var body []node
	for p.pos < len(p.segs) {
		seg := p.segs[p.pos]
		p.pos++
		switch seg.kind {
		case segText:
			body = append(body, textNode{seg.src})
		case segOutput:
			ep, err := newExprParser(seg.src, seg.line)
			if err != nil {
				return nil, "", err
			}
			e, err := ep.parseExpr()
			if err == nil {
				err = ep.expectEOF()
			}
			if err != nil {
				return nil, "", err
			}
			body = append(body, outputNode{e})
		case segStmt:
			ep, err := newExprParser(seg.src, seg.line)
			if err != nil {
				return nil, "", err
			}
			kw := ep.peek()
			if kw.kind != tkName {
				return nil, "", &SyntaxError{Line: seg.line, Msg: "expected a statement keyword"}
			}
			ep.next()
			switch kw.s {
			case "endif", "endfor", "endmacro", "endset", "endgeneration", "else", "elif":
				p.pending = ep
				return body, kw.s, nil
			}
			n, err := p.parseStmt(kw.s, ep, seg.line)
			if err != nil {
				return nil, "", err
			}
			if n != nil {
				body = append(body, n)
			}
		}
	}
	return body, "", nil
}

func (p *stmtParser) parseStmt(kw string, ep *exprParser, line int) (node, error) {
	switch kw {
	case "if":
		return p.parseIf(ep, line)
	case "for":
		return p.parseFor(ep, line)
	case "set":
		return p.parseSet(ep, line)
	case "macro":
		return p.parseMacro(ep, line)
	case "break", "continue":
		return loopCtlNode{brk: kw == "break"}, ep.expectEOF()
	case "generation":
		// transformers' assistant-mask marker: renders its body unchanged.
		if err := ep.expectEOF(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		if end != "endgeneration" {
			return nil, &SyntaxError{Line: line, Msg: "generation block not closed"}
		}
		return ifNode{conds: []expr{constExpr{true}}, bodies: [][]node{body}}, nil
	}
	return nil, &SyntaxError{Line: line, Msg: fmt.Sprintf("unsupported tag %q", kw)}
}

func (p *stmtParser) parseIf(ep *exprParser, line int) (node, error) {
	var n ifNode
	for {
		cond, err := ep.parseExpr()
		if err == nil {
			err = ep.expectEOF()
		}
		if err != nil {
			return nil, err
		}
		body, end, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		switch end {
		case "elif":
			ep = p.pending
			continue
		case "else":
			if err := p.pending.expectEOF(); err != nil {
				return nil, err
			}
			els, end, err := p.parseBody()
			if err != nil {
				return nil, err
			}
			if end != "endif" {
				return nil, &SyntaxError{Line: line, Msg: "if not closed by endif"}
			}
			n.els = els
			return n, nil
		case "endif":
			return n, nil
		default:
			return nil, &SyntaxError{Line: line, Msg: "if not closed by endif"}
		}
	}
}

func (p *stmtParser) parseFor(ep *exprParser, line int) (node, error) {
	n := forNode{line: line}
	for {
		t := ep.next()
		if t.kind != tkName {
			return nil, &SyntaxError{Line: line, Msg: "expected a loop variable"}
		}
		n.targets = append(n.targets, t.s)
		if !ep.acceptOp(",") {
			break
		}
	}
	if !ep.acceptName("in") {
		return nil, &SyntaxError{Line: line, Msg: "expected 'in' in for"}
	}
	var err error
	// The iterable is parsed without the conditional expression so that a
	// trailing "if" is the loop filter, as in Jinja.
	if n.iter, err = ep.parseOr(); err != nil {
		return nil, err
	}
	if ep.acceptName("if") {
		if n.cond, err = ep.parseExpr(); err != nil {
			return nil, err
		}
	}
	if ep.acceptName("recursive") {
		return nil, &SyntaxError{Line: line, Msg: "recursive loops are not supported"}
	}
	if err := ep.expectEOF(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	n.body = body
	if end == "else" {
		if err := p.pending.expectEOF(); err != nil {
			return nil, err
		}
		if n.els, end, err = p.parseBody(); err != nil {
			return nil, err
		}
	}
	if end != "endfor" {
		return nil, &SyntaxError{Line: line, Msg: "for not closed by endfor"}
	}
	return n, nil
}

func (p *stmtParser) parseSet(ep *exprParser, line int) (node, error) {
	var n setNode
	for {
		t := ep.next()
		if t.kind != tkName {
			return nil, &SyntaxError{Line: line, Msg: "expected a name after set"}
		}
		n.targets = append(n.targets, t.s)
		if len(n.targets) == 1 && ep.acceptOp(".") {
			a := ep.next()
			if a.kind != tkName {
				return nil, &SyntaxError{Line: line, Msg: "expected an attribute name"}
			}
			n.attr = a.s
			break
		}
		if !ep.acceptOp(",") {
			break
		}
	}
	if ep.peek().kind == tkEOF && len(n.targets) == 1 && n.attr == "" {
		body, end, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		if end != "endset" {
			return nil, &SyntaxError{Line: line, Msg: "block set not closed by endset"}
		}
		n.body = body
		return n, nil
	}
	if !ep.acceptOp("=") {
		return nil, &SyntaxError{Line: line, Msg: "expected '=' in set"}
	}
	var err error
	if n.e, err = ep.parseTuple(); err != nil {
		return nil, err
	}
	return n, ep.expectEOF()
}

func (p *stmtParser) parseMacro(ep *exprParser, line int) (node, error) {
	name := ep.next()
	if name.kind != tkName || !ep.acceptOp("(") {
		return nil, &SyntaxError{Line: line, Msg: "expected macro name and parameters"}
	}
	n := macroNode{name: name.s}
	for !ep.acceptOp(")") {
		t := ep.next()
		if t.kind != tkName {
			return nil, &SyntaxError{Line: line, Msg: "expected a parameter name"}
		}
		if slices.Contains(n.params, t.s) {
			return nil, &SyntaxError{Line: line, Msg: "duplicate parameter " + t.s}
		}
		var def expr
		if ep.acceptOp("=") {
			var err error
			if def, err = ep.parseExpr(); err != nil {
				return nil, err
			}
		}
		n.params = append(n.params, t.s)
		n.defaults = append(n.defaults, def)
		if !ep.acceptOp(",") {
			if !ep.acceptOp(")") {
				return nil, &SyntaxError{Line: line, Msg: "expected ',' or ')' in macro parameters"}
			}
			break
		}
	}
	if err := ep.expectEOF(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "endmacro" {
		return nil, &SyntaxError{Line: line, Msg: "macro not closed by endmacro"}
	}
	n.body = body
	return n, nil
}
