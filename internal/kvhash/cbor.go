package kvhash

// The few pieces of canonical CBOR (RFC 8949 §4.2: shortest argument,
// definite lengths) that vLLM's cbor2.dumps(..., canonical=True) produces for
// a block-hash input. Writing them by hand keeps hashing allocation-free.

const (
	majorUint  byte = 0 << 5
	majorNeg   byte = 1 << 5
	majorBytes byte = 2 << 5
	majorText  byte = 3 << 5
	majorArray byte = 4 << 5
	cborNull   byte = 0xf6
)

// appendHead writes a data item header: the major type and its argument
// (a value, a length or a count) in the shortest form.
func appendHead(b []byte, major byte, arg uint64) []byte {
	switch {
	case arg < 24:
		return append(b, major|byte(arg))
	case arg <= 0xff:
		return append(b, major|24, byte(arg))
	case arg <= 0xffff:
		return append(b, major|25, byte(arg>>8), byte(arg))
	case arg <= 0xffffffff:
		return append(b, major|26, byte(arg>>24), byte(arg>>16), byte(arg>>8), byte(arg))
	default:
		return append(b, major|27, byte(arg>>56), byte(arg>>48), byte(arg>>40), byte(arg>>32),
			byte(arg>>24), byte(arg>>16), byte(arg>>8), byte(arg))
	}
}

// appendInt encodes a Python int. Token ids are never negative, but a
// negative one still gets the encoding Python would give it rather than a
// silently wrapped value.
func appendInt(b []byte, v int) []byte {
	if v >= 0 {
		return appendHead(b, majorUint, uint64(v))
	}
	return appendHead(b, majorNeg, uint64(-(v + 1)))
}
