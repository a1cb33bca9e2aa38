package kvwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The decoder reads msgpack straight from the payload rather than through
// msgpack.Decoder: every length is checked against the bytes left before
// anything is allocated, so a hostile length cannot make it allocate more
// than a small multiple of the payload, and nothing is copied but the
// values kept.

// msgpack type codes (https://github.com/msgpack/msgpack/blob/master/spec.md).
const (
	mNil      = 0xc0
	mFalse    = 0xc2
	mTrue     = 0xc3
	mBin8     = 0xc4
	mBin16    = 0xc5
	mBin32    = 0xc6
	mExt8     = 0xc7
	mExt16    = 0xc8
	mExt32    = 0xc9
	mFloat32  = 0xca
	mFloat64  = 0xcb
	mUint8    = 0xcc
	mUint16   = 0xcd
	mUint32   = 0xce
	mUint64   = 0xcf
	mInt8     = 0xd0
	mInt16    = 0xd1
	mInt32    = 0xd2
	mInt64    = 0xd3
	mFixExt1  = 0xd4
	mFixExt16 = 0xd8
	mStr8     = 0xd9
	mStr16    = 0xda
	mStr32    = 0xdb
	mArray16  = 0xdc
	mArray32  = 0xdd
	mMap16    = 0xde
	mMap32    = 0xdf
)

// maxDepth bounds the nesting of values the decoder skips, so a payload of
// nested arrays cannot exhaust the stack.
const maxDepth = 32

// ErrTruncated means the payload ended inside a value.
var ErrTruncated = errors.New("kvwire: payload truncated")

// A TypeError means a value had an unexpected msgpack type.
type TypeError struct {
	Want string // what the decoder expected
	Code byte   // the msgpack type code found
	Off  int    // its offset in the payload
}

func (e *TypeError) Error() string {
	return fmt.Sprintf("kvwire: expected %s, found msgpack code 0x%02x at offset %d", e.Want, e.Code, e.Off)
}

type reader struct {
	b          []byte
	off        int
	skipTokens bool
	reserve    func(n int) error // DecodeOptions.Reserve; nil for none
}

// charge asks the reserve, if any, for n bytes about to be kept.
func (r *reader) charge(n int) error {
	if r.reserve == nil || n == 0 {
		return nil
	}
	return r.reserve(n)
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, ErrTruncated
	}
	return r.b[r.off], nil
}

func (r *reader) typeErr(want string) error {
	return &TypeError{Want: want, Code: r.b[r.off], Off: r.off}
}

// next returns the next n bytes.
func (r *reader) next(n int) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, ErrTruncated
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

// uintN reads a big-endian unsigned integer of n bytes (1, 2, 4 or 8).
func (r *reader) uintN(n int) (uint64, error) {
	p, err := r.next(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	default:
		return binary.BigEndian.Uint64(p), nil
	}
}

// nil consumes a nil and reports whether there was one.
func (r *reader) nil() bool {
	if r.off < len(r.b) && r.b[r.off] == mNil {
		r.off++
		return true
	}
	return false
}

// length reads the element count of a container whose fixed form is
// fixLow..fixLow+15 and sized forms are c16 and c32, and checks that the
// payload could hold that many elements of at least minSize bytes each.
func (r *reader) length(fixLow, c16, c32 byte, minSize int, want string) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= fixLow && c <= fixLow+0x0f:
		r.off++
		n = uint64(c - fixLow)
	case c == c16:
		r.off++
		n, err = r.uintN(2)
	case c == c32:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, r.typeErr(want)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(r.left()/minSize) {
		return 0, ErrTruncated
	}
	return int(n), nil
}

func (r *reader) arrayLen() (int, error) {
	return r.length(0x90, mArray16, mArray32, 1, "array")
}

func (r *reader) mapLen() (int, error) {
	return r.length(0x80, mMap16, mMap32, 2, "map")
}

// str returns the bytes of a string (aliasing the payload).
func (r *reader) str() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		n = uint64(c & 0x1f)
	case c == mStr8:
		r.off++
		n, err = r.uintN(1)
	case c == mStr16:
		r.off++
		n, err = r.uintN(2)
	case c == mStr32:
		r.off++
		n, err = r.uintN(4)
	default:
		return nil, r.typeErr("string")
	}
	if err != nil {
		return nil, err
	}
	return r.next(int(min(n, math.MaxInt32)))
}

// optStr reads a string or nil ("").
func (r *reader) optStr() (string, error) {
	if r.nil() {
		return "", nil
	}
	s, err := r.str()
	return string(s), err
}

// bin returns the bytes of a bin value (aliasing the payload).
func (r *reader) bin() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch c {
	case mBin8:
		r.off++
		n, err = r.uintN(1)
	case mBin16:
		r.off++
		n, err = r.uintN(2)
	case mBin32:
		r.off++
		n, err = r.uintN(4)
	default:
		return nil, r.typeErr("bytes")
	}
	if err != nil {
		return nil, err
	}
	return r.next(int(min(n, math.MaxInt32)))
}

// int reads any msgpack integer as an int64; uint64 values above
// math.MaxInt64 wrap, which is what a hash's bits want.
func (r *reader) int() (int64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c <= 0x7f {
		r.off++
		return int64(c), nil
	}
	if c >= 0xe0 {
		r.off++
		return int64(int8(c)), nil
	}
	var size int
	signed := false
	switch c {
	case mUint8:
		size = 1
	case mUint16:
		size = 2
	case mUint32:
		size = 4
	case mUint64:
		size = 8
	case mInt8:
		size, signed = 1, true
	case mInt16:
		size, signed = 2, true
	case mInt32:
		size, signed = 4, true
	case mInt64:
		size, signed = 8, true
	default:
		return 0, r.typeErr("integer")
	}
	r.off++
	v, err := r.uintN(size)
	if err != nil || !signed {
		return int64(v), err
	}
	shift := 64 - 8*size
	return int64(v<<shift) >> shift, nil
}

// float reads a float or an integer as a float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case mFloat32:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	case mFloat64:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	}
	v, err := r.int()
	return float64(v), err
}

// skip steps over one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("kvwire: values nested deeper than %d at offset %d", maxDepth, r.off)
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	var n int
	switch {
	case c <= 0x7f || c >= 0xe0 || c == mNil || c == mFalse || c == mTrue:
		r.off++
		return nil
	case c >= 0xa0 && c <= 0xbf, c == mStr8, c == mStr16, c == mStr32:
		_, err = r.str()
		return err
	case c == mBin8 || c == mBin16 || c == mBin32:
		_, err = r.bin()
		return err
	case c == mFloat32, c == mFloat64:
		_, err = r.float()
		return err
	case c >= mUint8 && c <= mInt64:
		_, err = r.int()
		return err
	case c >= mFixExt1 && c <= mFixExt16:
		_, err = r.next(2 + 1<<(c-mFixExt1))
		return err
	case c == mExt8 || c == mExt16 || c == mExt32:
		r.off++
		size := 1 << (c - mExt8) // 1, 2 or 4 length bytes
		l, err := r.uintN(size)
		if err != nil {
			return err
		}
		_, err = r.next(int(min(l+1, math.MaxInt32))) // type byte and data
		return err
	case c >= 0x90 && c <= 0x9f, c == mArray16, c == mArray32:
		if n, err = r.arrayLen(); err != nil {
			return err
		}
	case c >= 0x80 && c <= 0x8f, c == mMap16, c == mMap32:
		if n, err = r.mapLen(); err != nil {
			return err
		}
		n *= 2
	default:
		return r.typeErr("a msgpack value")
	}
	for range n {
		if err := r.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}
