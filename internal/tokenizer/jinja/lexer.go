package jinja

import (
	"fmt"
	"strings"
)

// SyntaxError reports a template that cannot be parsed.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("jinja: line %d: %s", e.Line, e.Msg) }

// segment is a piece of template source: literal text, an output tag or a
// statement tag, with its inner source.
type segKind uint8

const (
	segText segKind = iota
	segOutput
	segStmt
)

type segment struct {
	kind segKind
	src  string
	line int
}

// splitSegments cuts the source into segments, applying whitespace control
// ({%- -%} etc.) and the trim_blocks/lstrip_blocks rules HF enables. Like
// Jinja, it normalises newlines and drops one trailing newline.
func splitSegments(src string) ([]segment, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	var segs []segment
	line := 1
	// lineStarting: the previous tag's match ended with a newline, so a
	// block tag right after it is at a line start (lstrip_blocks).
	lineStarting := true
	for len(src) > 0 {
		i := indexTagStart(src)
		if i < 0 {
			segs = append(segs, segment{kind: segText, src: src, line: line})
			break
		}
		text := src[:i]
		open := src[i : i+2]
		rest := src[i+2:]
		sign := byte(0)
		if strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
			sign, rest = rest[0], rest[1:]
		}
		switch {
		case sign == '-':
			text = strings.TrimRight(text, " \t\n\v\f\r")
		case sign != '+' && open != "{{":
			l := strings.LastIndexByte(text, '\n') + 1
			if (l > 0 || lineStarting) && strings.Trim(text[l:], " \t") == "" {
				text = text[:l]
			}
		}
		if text != "" {
			segs = append(segs, segment{kind: segText, src: text, line: line})
		}
		line += strings.Count(src[:i], "\n")
		closeTag := map[string]string{"{{": "}}", "{%": "%}", "{#": "#}"}[open]
		end := findClose(rest, closeTag, open != "{#")
		if end < 0 {
			return nil, &SyntaxError{Line: line, Msg: "unclosed " + open}
		}
		inner := rest[:end]
		rightSign := byte(0)
		if strings.HasSuffix(inner, "-") || strings.HasSuffix(inner, "+") {
			rightSign, inner = inner[len(inner)-1], inner[:len(inner)-1]
		}
		switch open {
		case "{{":
			segs = append(segs, segment{kind: segOutput, src: inner, line: line})
		case "{%":
			segs = append(segs, segment{kind: segStmt, src: inner, line: line})
		}
		line += strings.Count(src[i:len(src)-len(rest)+end], "\n")
		src = rest[end+2:]
		lineStarting = false
		switch {
		case rightSign == '-':
			trimmed := strings.TrimLeft(src, " \t\n\v\f\r")
			ws := src[:len(src)-len(trimmed)]
			line += strings.Count(ws, "\n")
			lineStarting = strings.HasSuffix(ws, "\n")
			src = trimmed
		case open != "{{" && strings.HasPrefix(src, "\n"): // trim_blocks
			src = src[1:]
			line++
			lineStarting = true
		}
	}
	return segs, nil
}

func indexTagStart(s string) int {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '{' && (s[i+1] == '{' || s[i+1] == '%' || s[i+1] == '#') {
			return i
		}
	}
	return -1
}

// findClose returns the offset of closeTag in s, skipping string literals
// when inCode (so that "}}" inside a quoted string does not end the tag).
func findClose(s, closeTag string, inCode bool) int {
	if !inCode {
		return strings.Index(s, closeTag)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '"':
			for i++; i < len(s) && s[i] != c; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case strings.HasPrefix(s[i:], closeTag):
			return i
		}
	}
	return -1
}
