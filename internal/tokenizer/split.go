package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Character classes of the split pattern. ASCII is looked up in a table
// because English text is almost all ASCII and unicode.Is* is comparatively
// slow.
const (
	clsOther   uint8 = iota // [^\s\p{L}\p{N}]
	clsLetter               // \p{L}
	clsNumber               // \p{N}
	clsSpace                // \s other than \r and \n
	clsNewline              // \r or \n
)

var asciiClass [128]uint8

func init() {
	for b := 0; b < 128; b++ {
		asciiClass[b] = classOf(rune(b))
	}
}

func classOf(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return clsNewline
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		// unicode.IsSpace is the White_Space property, which is what
		// Oniguruma (the regex engine behind the Rust tokenizers crate)
		// uses for \s.
		return clsSpace
	}
	return clsOther
}

// runeAt decodes the rune starting s and its class.
func runeAt(s string) (r rune, size int, cls uint8) {
	if b := s[0]; b < utf8.RuneSelf {
		return rune(b), 1, asciiClass[b]
	}
	r, size = utf8.DecodeRuneInString(s)
	return r, size, classOf(r)
}

// runEnd returns the length of the longest prefix of s whose runes all have
// class cls.
func runEnd(s string, cls uint8) int {
	i := 0
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf {
			if asciiClass[b] != cls {
				return i
			}
			i++
			continue
		}
		_, n, c := runeAt(s[i:])
		if c != cls {
			return i
		}
		i += n
	}
	return i
}

// nextPreToken returns the length of the pre-token at the start of s (which
// must be non-empty) under the Qwen2/Llama 3 split pattern
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// evaluated the way a backtracking engine does: alternatives in order, the
// first that matches wins.
func nextPreToken(s string, maxDigits int) int {
	r0, n0, c0 := runeAt(s)
	if r0 == '\'' {
		if n := contractionLen(s[1:]); n > 0 {
			return 1 + n
		}
	}
	switch c0 {
	case clsLetter:
		return n0 + runEnd(s[n0:], clsLetter)
	case clsNumber:
		i, k := n0, 1
		for k < maxDigits && i < len(s) {
			_, n, c := runeAt(s[i:])
			if c != clsNumber {
				break
			}
			i += n
			k++
		}
		return i
	case clsNewline:
		// cannot start [^\r\n\p{L}\p{N}]?\p{L}+; handled with whitespace below.
	default:
		// [^\r\n\p{L}\p{N}]?\p{L}+ with the optional rune present.
		if n0 < len(s) {
			if _, n1, c1 := runeAt(s[n0:]); c1 == clsLetter {
				return n0 + n1 + runEnd(s[n0+n1:], clsLetter)
			}
		}
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	start := -1
	if c0 == clsOther {
		start = 0
	} else if r0 == ' ' && n0 < len(s) {
		if _, _, c1 := runeAt(s[n0:]); c1 == clsOther {
			start = n0
		}
	}
	if start >= 0 {
		i := start + runEnd(s[start:], clsOther)
		for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
			i++
		}
		return i
	}
	// Whitespace: c0 is clsSpace or clsNewline. Scan the maximal run,
	// remembering the last newline and the start of the last rune.
	end, lastNL, lastStart, runes := 0, -1, 0, 0
	for end < len(s) {
		_, n, c := runeAt(s[end:])
		if c != clsSpace && c != clsNewline {
			break
		}
		if c == clsNewline {
			lastNL = end
		}
		lastStart = end
		end += n
		runes++
	}
	switch {
	case lastNL >= 0: // \s*[\r\n]+ : greedy \s* backs off to the last newline
		return lastNL + 1
	case end == len(s): // \s+(?!\S) at end of text
		return end
	case runes >= 2: // \s+(?!\S) gives back the last rune
		return lastStart
	default: // \s+
		return end
	}
}

// contractionLen matches (?i:s|t|re|ve|m|ll|d) at the start of s (the text
// after an apostrophe) and returns its length in bytes, or 0.
func contractionLen(s string) int {
	if s == "" {
		return 0
	}
	r, n := utf8.DecodeRuneInString(s)
	switch foldASCII(r) {
	case 's', 't', 'm', 'd':
		return n
	case 'r', 'v':
		if len(s) > n {
			if r2, n2 := utf8.DecodeRuneInString(s[n:]); foldASCII(r2) == 'e' {
				return n + n2
			}
		}
	case 'l':
		if len(s) > n {
			if r2, n2 := utf8.DecodeRuneInString(s[n:]); foldASCII(r2) == 'l' {
				return n + n2
			}
		}
	}
	return 0
}

// foldASCII maps r to the lower-case ASCII letter it case-folds to, or 0.
// Besides A-Z only U+017F (long s) and U+212A (Kelvin sign) fold into ASCII.
func foldASCII(r rune) rune {
	switch {
	case r >= 'a' && r <= 'z':
		return r
	case r >= 'A' && r <= 'Z':
		return r + 'a' - 'A'
	case r == 0x17F:
		return 's'
	case r == 0x212A:
		return 'k'
	}
	return 0
}
