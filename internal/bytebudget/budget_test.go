package bytebudget

import (
	"errors"
	"sync"
	"testing"
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
