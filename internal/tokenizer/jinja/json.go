package jinja

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// toJSON is transformers' tojson filter: Python json.dumps with
// ensure_ascii=False, ", " and ": " separators (or newlines and indent when
// indent > 0), keys in insertion order.
func toJSON(v Value, indent int) (string, error) {
	var b strings.Builder
	if err := writeJSON(&b, v, indent, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSON(b *strings.Builder, v Value, indent, level int) error {
	if level > maxNesting {
		return errorf("tojson: value nested too deeply")
	}
	newline := func(l int) {
		if indent > 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*l))
		}
	}
	itemSep := ", "
	if indent > 0 {
		itemSep = ","
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case Undefined:
		return errorf("tojson: %s is undefined", x.Name)
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		s := pyFloat(x)
		switch s {
		case "inf":
			s = "Infinity"
		case "-inf":
			s = "-Infinity"
		case "nan":
			s = "NaN"
		}
		b.WriteString(s)
	case string:
		writeJSONString(b, x)
	case []Value:
		if len(x) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(level + 1)
			if err := writeJSON(b, e, indent, level+1); err != nil {
				return err
			}
		}
		newline(level)
		b.WriteByte(']')
	case *Dict:
		if x.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(level + 1)
			writeJSONString(b, k)
			b.WriteString(": ")
			if err := writeJSON(b, x.m[k], indent, level+1); err != nil {
				return err
			}
		}
		newline(level)
		b.WriteByte('}')
	default:
		return errorf("tojson: cannot encode %s", typeName(v))
	}
	return nil
}

// writeJSONString escapes like Python's json with ensure_ascii=False:
// only quotes, backslashes and control characters.
func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
