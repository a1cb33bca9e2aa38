package jinja

import (
	"strconv"
	"strings"
)

type tokKind uint8

const (
	tkEOF tokKind = iota
	tkName
	tkString
	tkInt
	tkFloat
	tkOp
)

type token struct {
	kind tokKind
	s    string // name, operator, or decoded string literal
	i    int64
	f    float64
}

// operators, longest first so that "//" wins over "/".
var operators = []string{"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ".", ",", ":", "|"}

// lexExpr tokenizes the inside of a tag.
func lexExpr(src string, line int) ([]token, error) {
	var toks []token
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || isAlpha(c):
			j := i + 1
			for j < len(src) && (src[j] == '_' || isAlpha(src[j]) || isDigit(src[j])) {
				j++
			}
			toks = append(toks, token{kind: tkName, s: src[i:j]})
			i = j
		case isDigit(c):
			j := i
			for j < len(src) && (isDigit(src[j]) || src[j] == '_') {
				j++
			}
			isFloat := false
			if j+1 < len(src) && src[j] == '.' && isDigit(src[j+1]) {
				isFloat = true
				j++
				for j < len(src) && isDigit(src[j]) {
					j++
				}
			}
			if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
				k := j + 1
				if k < len(src) && (src[k] == '+' || src[k] == '-') {
					k++
				}
				if k < len(src) && isDigit(src[k]) {
					isFloat = true
					for j = k; j < len(src) && isDigit(src[j]); j++ {
					}
				}
			}
			lit := strings.ReplaceAll(src[i:j], "_", "")
			if isFloat {
				f, err := strconv.ParseFloat(lit, 64)
				if err != nil {
					return nil, &SyntaxError{Line: line, Msg: "bad number " + lit}
				}
				toks = append(toks, token{kind: tkFloat, f: f})
			} else {
				n, err := strconv.ParseInt(lit, 10, 64)
				if err != nil {
					return nil, &SyntaxError{Line: line, Msg: "bad number " + lit}
				}
				toks = append(toks, token{kind: tkInt, i: n})
			}
			i = j
		case c == '\'' || c == '"':
			s, n, err := unquote(src[i:], line)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tkString, s: s})
			i += n
		default:
			matched := false
			for _, op := range operators {
				if strings.HasPrefix(src[i:], op) {
					toks = append(toks, token{kind: tkOp, s: op})
					i += len(op)
					matched = true
					break
				}
			}
			if !matched {
				return nil, &SyntaxError{Line: line, Msg: "unexpected character " + strconv.QuoteRune(rune(c))}
			}
		}
	}
	return append(toks, token{kind: tkEOF}), nil
}

func isAlpha(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// unquote decodes a Python string literal at the start of s and returns it
// with the number of bytes consumed.
func unquote(s string, line int) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return b.String(), i + 1, nil
		case c == '\\' && i+1 < len(s):
			i++
			switch e := s[i]; e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '0':
				b.WriteByte(0)
			case '\\', '\'', '"':
				b.WriteByte(e)
			case '\n':
			case 'u', 'x':
				width := 4
				if e == 'x' {
					width = 2
				}
				if i+width >= len(s) {
					return "", 0, &SyntaxError{Line: line, Msg: "bad escape in string"}
				}
				n, err := strconv.ParseUint(s[i+1:i+1+width], 16, 32)
				if err != nil {
					return "", 0, &SyntaxError{Line: line, Msg: "bad escape in string"}
				}
				b.WriteRune(rune(n))
				i += width
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, &SyntaxError{Line: line, Msg: "unterminated string"}
}
