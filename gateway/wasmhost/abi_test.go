package wasmhost

import (
	"bytes"
	"slices"
	"testing"
)

// FuzzDecodePairs: the header map a filter hands the host is guest memory,
// untrusted. decodePairs must never panic, must take back what encodePairs
// wrote, and what it accepts must encode to the same bytes once the
// terminators are NUL.
func FuzzDecodePairs(f *testing.F) {
	f.Add(encodePairs([][2]string{{":path", "/v1/chat/completions"}, {"x-a", ""}}))
	f.Add(encodePairs(nil))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pairs, ok := decodePairs(b)
		if !ok {
			return
		}
		again, ok := decodePairs(encodePairs(pairs))
		if !ok || !slices.Equal(again, pairs) {
			t.Fatalf("round trip of %q: %q %v", pairs, again, ok)
		}
		if enc := encodePairs(pairs); len(enc) != len(b) || !bytes.Equal(enc[:4+8*len(pairs)], b[:4+8*len(pairs)]) {
			t.Fatalf("accepted %x as %q, which encodes to %x", b, pairs, enc)
		}
	})
}
