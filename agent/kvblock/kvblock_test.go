package kvblock

import (
	"os"
	"testing"
)

func TestFillCheck(t *testing.T) {
	for _, n := range []int{1, 7, 8, 4096, 4099} {
		b := make([]byte, n)
		Fill(b, 42)
		if at := Check(b, 42); at != -1 {
			t.Fatalf("n=%d: own content differs at %d", n, at)
		}
		if Check(b, 43) == -1 {
			t.Fatalf("n=%d: content of hash 42 passes as hash 43", n)
		}
		b[n-1] ^= 1
		if at := Check(b, 42); at != n-1 && !(n >= 8 && at == (n-1)/8*8) {
			t.Fatalf("n=%d: flipped last byte reported at %d", n, at)
		}
	}
}

func TestMapShared(t *testing.T) {
	path := t.TempDir() + "/region"
	a, err := Map(path, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(a)
	b, err := Map(path, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(b)
	Fill(a[4096:8192], 7)
	if Check(b[4096:8192], 7) != -1 {
		t.Fatal("second mapping does not see the first one's bytes")
	}
	if st, _ := os.Stat(path); st.Size() != 1<<16 {
		t.Fatalf("file size %d", st.Size())
	}
	if _, err := Map(path, 0); err == nil {
		t.Fatal("size 0 accepted")
	}
}

// TestContentHash: a block's first word names the hash it was filled
// for, whatever the block's length (a failed check reports the block a
// slot holds instead).
func TestContentHash(t *testing.T) {
	for _, h := range []uint64{0, 1, 42, 1 << 63, 0xdeadbeefcafebabe, ^uint64(0)} {
		for _, n := range []int{8, 13, 4096} {
			b := make([]byte, n)
			Fill(b, h)
			if got := ContentHash(b); got != h {
				t.Fatalf("hash %#x, %d bytes: ContentHash %#x", h, n, got)
			}
		}
	}
	if got := ContentHash(make([]byte, 7)); got != 0 {
		t.Fatalf("7 bytes: %#x", got)
	}
	if b := make([]byte, 64); Check(b, ContentHash(b)) == -1 {
		t.Fatal("zeros pass as a block's content")
	}
}
