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

// TestMapOver: a file mapped over a blanked range shows through the same
// addresses, and a smaller file over a prefix leaves the rest blank.
func TestMapOver(t *testing.T) {
	dir := t.TempDir()
	b, err := Map(dir+"/old", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(b)
	Fill(b, 1)
	if err := Blank(b); err != nil {
		t.Fatal(err)
	}
	if ContentHash(b) != ContentHash(make([]byte, 8)) {
		t.Fatal("blanked range still shows the old file")
	}
	f, err := os.OpenFile(dir+"/new", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := MapOver(f, b[:1<<12]); err != nil {
		t.Fatal(err)
	}
	c, err := Map(dir+"/new", 1<<12)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(c)
	Fill(c, 9)
	if at := Check(b[:1<<12], 9); at != -1 {
		t.Fatalf("the range does not show the new file (differs at %d)", at)
	}
	for i, v := range b[1<<12:] {
		if v != 0 {
			t.Fatalf("byte %d past the new file is %d, want the blank range's 0", 1<<12+i, v)
		}
	}
	if err := MapOver(f, nil); err == nil {
		t.Fatal("an empty range accepted")
	}
}
