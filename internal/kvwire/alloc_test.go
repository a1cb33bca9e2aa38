package kvwire

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/kvgate/kvgate/internal/testutil"
)

// array32 is a msgpack array32 header for n elements.
func array32(n int) []byte {
	return binary.BigEndian.AppendUint32([]byte{mArray32}, uint32(n))
}

// TestDecodeAllocationBounded checks that what Decode allocates is bounded
// by what the payload holds, not by the counts it claims: a message that
// claims as many elements as it has bytes, then fails at the first, must
// cost next to nothing, and a valid one no more than its values need.
func TestDecodeAllocationBounded(t *testing.T) {
	const n = 1 << 18
	fill := func(b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	stored := cat([]byte{0x91, 0xab}, []byte(TypeBlockStored))
	tests := []struct {
		name    string
		payload []byte
		valid   bool
		max     float64 // bytes allocated per payload byte
	}{
		{"events failing at the first", cat([]byte{0x92, 0x00}, array32(n), fill(mNil)), false, 1.5},
		{"hashes failing at the first", cat([]byte{0x92, 0x00, 0x91, 0x92, 0xab}, []byte(TypeBlockStored), array32(n), fill(mNil)), false, 1},
		{"token ids failing at the first", cat([]byte{0x92, 0x00, 0x91, 0x94, 0xab}, []byte(TypeBlockStored), []byte{0x90, mNil}, array32(n), fill(mNil)), false, 1},
		{"1-byte hashes", cat([]byte{0x92, 0x00, 0x91, 0x92, 0xab}, []byte(TypeBlockStored), array32(n), fill(0x01)), true, 16.5},
		{"1-byte token ids", cat([]byte{0x92, 0x00, 0x91, 0x94, 0xab}, []byte(TypeBlockStored), []byte{0x90, mNil}, array32(n), fill(0x01)), true, 8.5},
		{"events without fields", cat([]byte{0x92, 0x00}, array32(n/len(stored)), bytes.Repeat(stored, n/len(stored))), true, 11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := Decode(tt.payload); (err == nil) != tt.valid {
				t.Fatalf("Decode error %v, want valid=%v", err, tt.valid)
			}
			got := testutil.AllocatedPerByte(len(tt.payload), func() { _, _, _ = Decode(tt.payload) })
			t.Logf("%.2f bytes allocated per payload byte", got)
			if got > tt.max {
				t.Errorf("Decode allocated %.2f bytes per payload byte, want at most %.1f", got, tt.max)
			}
		})
	}
}
