package bytebudget

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"testing"
	"testing/iotest"
)

func TestBudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   int64
		reserve []int64
		wantOK  []bool
		used    int64
	}{
		{"unlimited", 0, []int64{1 << 40, 1 << 40}, []bool{true, true}, 2 << 40},
		{"fits exactly", 10, []int64{4, 6}, []bool{true, true}, 10},
		{"refuses over, keeps what fits", 10, []int64{4, 7, 6}, []bool{true, false, true}, 10},
		{"zero and negative are free", 1, []int64{0, -5, 1}, []bool{true, true, true}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New(tc.limit)
			for i, n := range tc.reserve {
				err := b.Reserve(n)
				if (err == nil) != tc.wantOK[i] {
					t.Fatalf("Reserve(%d) #%d = %v, want ok=%v", n, i, err, tc.wantOK[i])
				}
				if err != nil && !errors.Is(err, ErrExhausted) {
					t.Fatalf("error %v does not wrap ErrExhausted", err)
				}
			}
			if b.Used() != tc.used {
				t.Fatalf("used %d, want %d", b.Used(), tc.used)
			}
		})
	}
}

func TestHolder(t *testing.T) {
	b := New(100)
	h := b.Hold()
	if err := h.Grow(60); err != nil {
		t.Fatal(err)
	}
	if err := h.Grow(40); err != nil || b.Used() != 60 {
		t.Fatalf("shrinking Grow: err %v used %d", err, b.Used())
	}
	h2 := b.Hold()
	if err := h2.Grow(50); !errors.Is(err, ErrExhausted) {
		t.Fatalf("second holder over the budget: %v", err)
	}
	h.Done()
	h.Done()
	if b.Used() != 0 || b.Peak() != 60 {
		t.Fatalf("after Done: used %d peak %d", b.Used(), b.Peak())
	}
	if err := h2.Grow(50); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentNeverOver(t *testing.T) {
	b := New(1000)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 1000 {
				if b.Reserve(100) == nil {
					if u := b.Used(); u > 1000 {
						t.Errorf("used %d over the limit", u)
					}
					b.Release(100)
				}
			}
		})
	}
	wg.Wait()
	if b.Used() != 0 || b.Peak() > 1000 {
		t.Fatalf("used %d peak %d", b.Used(), b.Peak())
	}
}

func TestNil(t *testing.T) {
	var b *Budget
	if err := b.Reserve(1 << 50); err != nil || b.Used() != 0 || b.Limit() != 0 {
		t.Fatal("nil budget is not unlimited")
	}
	b.Release(5)
	h := b.Hold()
	if err := h.Grow(10); err != nil {
		t.Fatal(err)
	}
	h.Done()
}

// ReadUpTo reads to EOF or to its limit, its buffer's bytes reserved
// before they are allocated; a budget without room fails it.
func TestReadUpTo(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name     string
		body     int
		limit    int
		budget   int64
		readErr  error
		wantLen  int
		wantEOF  bool
		wantErr  error
		wantHeld int64
	}{
		{"short body", 10, 100, -1, nil, 10, true, nil, 100},
		{"at the limit", 100, 100, -1, nil, 100, false, nil, 100},
		{"past the limit", 1 << 20, 70 << 10, -1, nil, 70 << 10, false, nil, 70 << 10},
		{"grows by doubling", 200 << 10, 1 << 20, -1, nil, 200 << 10, true, nil, 256 << 10},
		{"no room", 10, 100, 50, nil, 0, false, ErrExhausted, 0},
		{"no room to grow", 100 << 10, 1 << 20, 100 << 10, nil, 0, false, ErrExhausted, 64 << 10},
		{"a read error", 10, 100, -1, boom, 0, false, boom, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(tt.budget)
			h := b.Hold()
			var r io.Reader = bytes.NewReader(make([]byte, tt.body))
			if tt.readErr != nil {
				r = io.MultiReader(r, iotest.ErrReader(tt.readErr))
			}
			got, eof, err := ReadUpTo(r, tt.limit, &h)
			if len(got) != tt.wantLen || eof != tt.wantEOF || !errors.Is(err, tt.wantErr) {
				t.Fatalf("ReadUpTo = %d bytes, eof %v, err %v; want %d, %v, %v", len(got), eof, err, tt.wantLen, tt.wantEOF, tt.wantErr)
			}
			if h.Held() != tt.wantHeld || b.Used() != tt.wantHeld {
				t.Fatalf("held %d, budget used %d; want %d", h.Held(), b.Used(), tt.wantHeld)
			}
			h.Done()
			if b.Used() != 0 {
				t.Fatalf("budget used %d after Done", b.Used())
			}
		})
	}
}

// Append grows as append would, to at most its limit, reserving each
// larger buffer before allocating it, and leaves buf as it was when the
// budget has no room.
func TestAppend(t *testing.T) {
	tests := []struct {
		name     string
		chunks   []int
		limit    int
		budget   int64
		wantCaps []int // cap after each chunk
		wantErr  int   // index of the chunk the budget refuses; -1: none
	}{
		{"doubles", []int{10, 5, 20}, 1000, -1, []int{10, 20, 40}, -1},
		{"capped at the limit", []int{10, 15, 5}, 30, -1, []int{10, 25, 30}, -1},
		{"fits the spare capacity", []int{10, 5, 5}, 1000, -1, []int{10, 20, 20}, -1},
		{"refused", []int{10, 15}, 1000, 15, []int{10, 10}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(tt.budget)
			h := b.Hold()
			var buf []byte
			want := 0
			for i, n := range tt.chunks {
				var err error
				buf, err = h.Append(buf, bytes.Repeat([]byte{byte(i)}, n), tt.limit)
				if refused := errors.Is(err, ErrExhausted); refused != (i == tt.wantErr) {
					t.Fatalf("chunk %d: err %v", i, err)
				}
				if err == nil {
					want += n
				}
				if len(buf) != want || cap(buf) != tt.wantCaps[i] || h.Held() != int64(cap(buf)) || b.Used() != h.Held() {
					t.Fatalf("chunk %d: len %d cap %d held %d used %d; want len %d cap %d", i, len(buf), cap(buf), h.Held(), b.Used(), want, tt.wantCaps[i])
				}
			}
			if buf[0] != 0 || (len(tt.chunks) > 1 && tt.wantErr != 1 && buf[tt.chunks[0]] != 1) {
				t.Fatalf("bytes not appended in order: % x", buf[:min(len(buf), 16)])
			}
		})
	}
}
