package kvwire

import (
	"bytes"
	"encoding/binary"
	"errors"
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

// TestDecodeChargesWhatItKeeps checks that DecodeOptions.Reserve is asked
// for about what Decode allocates, for the batches that decode to the most
// per payload byte, so that a consumer charging it to a memory budget
// counts what decoding costs; and that a refusal stops the decode.
func TestDecodeChargesWhatItKeeps(t *testing.T) {
	const n = 1 << 16
	fill := func(b ...byte) []byte { return bytes.Repeat(b, n) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	stored := cat([]byte{0x91, 0xab}, []byte(TypeBlockStored))
	typical := make([]Event, 64)
	for i := range typical {
		hs := make([]Hash, 32)
		for k := range hs {
			hs[k] = Uint64Hash(uint64(i*32+k) * 0x9e3779b97f4a7c15)
		}
		parent := Uint64Hash(uint64(i))
		typical[i] = BlockStored{BlockHashes: hs, ParentBlockHash: &parent, TokenIDs: make([]int, 32*16), BlockSize: 16, Medium: MediumGPU}
	}
	typicalMap, err := Encode(EventBatch{Events: typical}, EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		payload []byte
		opts    DecodeOptions
	}{
		{"1-byte hashes", cat([]byte{0x92, 0x00, 0x91, 0x92, 0xab}, []byte(TypeBlockStored), array32(n), fill(0x01)), DecodeOptions{}},
		{"1-byte digests", cat([]byte{0x92, 0x00, 0x91, 0x92, 0xab}, []byte(TypeBlockStored), array32(n), fill(mBin8, 1, 0x07)), DecodeOptions{}},
		{"1-byte token ids", cat([]byte{0x92, 0x00, 0x91, 0x94, 0xab}, []byte(TypeBlockStored), []byte{0x90, mNil}, array32(n), fill(0x01)), DecodeOptions{}},
		{"events without fields", cat([]byte{0x92, 0x00}, array32(n/len(stored)), bytes.Repeat(stored, n/len(stored))), DecodeOptions{}},
		{"engine batches, map encoding", typicalMap, DecodeOptions{}},
		{"engine batches, token ids skipped", typicalMap, DecodeOptions{SkipTokenIDs: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			charged := 0
			opts := tt.opts
			opts.Reserve = func(n int) error { charged += n; return nil }
			if _, _, err := opts.Decode(tt.payload); err != nil {
				t.Fatal(err)
			}
			want := charged
			allocated := testutil.AllocatedPerByte(len(tt.payload), func() {
				charged = 0
				_, _, _ = opts.Decode(tt.payload)
			})
			perByte := float64(want) / float64(len(tt.payload))
			t.Logf("%.2f bytes allocated, %.2f charged per payload byte", allocated, perByte)
			// Size classes round allocations up a little; the closure
			// and slices of a few bytes are not charged.
			if perByte < 0.8*allocated || perByte > 1.05*allocated {
				t.Errorf("charged %.2f bytes per payload byte for %.2f allocated, want within [0.8, 1.05] of it", perByte, allocated)
			}
			errRefused := errors.New("refused")
			budget := len(tt.payload)
			opts.Reserve = func(n int) error {
				if n > budget {
					return errRefused
				}
				budget -= n
				return nil
			}
			if _, _, err := opts.Decode(tt.payload); perByte > 1 && !errors.Is(err, errRefused) {
				t.Errorf("Decode with a budget of the payload's size: error %v, want the refusal", err)
			}
		})
	}
}
