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
