package tokenizer

import "unicode/utf8"

// byteToRune is GPT-2's reversible byte→printable-rune mapping that byte-level
// BPE vocabularies are written in: printable Latin-1 bytes stand for
// themselves, the rest are shifted to U+0100 and up in byte order.
var byteToRune [256]rune

// runeToByte inverts byteToRune; entries for runes outside the mapping are -1.
var runeToByte [512]int16

func init() {
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	next := rune(256)
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = next
			next++
		}
		runeToByte[byteToRune[b]] = int16(b)
	}
}

// byteLevelString maps raw bytes to their vocabulary spelling.
func byteLevelString(s string) string {
	buf := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		buf = utf8.AppendRune(buf, byteToRune[s[i]])
	}
	return string(buf)
}

// appendByteLevelDecoded appends the raw bytes a vocabulary token spells. It
// reports false when tok contains a rune outside the byte-level alphabet.
func appendByteLevelDecoded(dst []byte, tok string) ([]byte, bool) {
	for _, r := range tok {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return dst, false
		}
		dst = append(dst, byte(runeToByte[r]))
	}
	return dst, true
}
