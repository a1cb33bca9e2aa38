package progress

import (
	"bytes"
	"testing"
)

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		done, total int
		want        string
	}{
		{0, 10, "[" + dots(40) + "]"},
		{30, 40, "[##############################..........]"},
		{10, 10, "[########################################]"},
		{12, 10, "[########################################]"}, // a late update never overflows
		{1, 0, "[" + dots(40) + "]"},
	} {
		if got := Bar(tc.done, tc.total); got != tc.want {
			t.Errorf("Bar(%d, %d) = %q, want %q", tc.done, tc.total, got, tc.want)
		}
	}
	if IsTerminal(&bytes.Buffer{}) {
		t.Fatal("a buffer is not a terminal")
	}
}

func dots(n int) string { return string(bytes.Repeat([]byte("."), n)) }
