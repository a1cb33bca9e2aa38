package plot

import (
	"bytes"
	"errors"
	"image/png"
	"math"
	"testing"
)

func TestRender(t *testing.T) {
	tests := []struct {
		name  string
		chart Chart
		err   error
	}{
		{"lines", Chart{Title: "t", Series: []Series{{Name: "a", X: []float64{0, 1, 2}, Y: []float64{1, 4, 2}}, {Name: "b", X: []float64{0, 2}, Y: []float64{3, 3}}}}, nil},
		{"log drops non-positive", Chart{LogY: true, Series: []Series{{X: []float64{1, 2, 3}, Y: []float64{0, 0.01, 100}}}}, nil},
		{"single point", Chart{Series: []Series{{X: []float64{5}, Y: []float64{5}}}}, nil},
		{"empty", Chart{}, ErrNoData},
		{"only NaN", Chart{Series: []Series{{X: []float64{math.NaN()}, Y: []float64{1}}}}, ErrNoData},
		{"too small", Chart{Width: 10, Series: []Series{{X: []float64{1}, Y: []float64{1}}}}, errAny},
	}
	for _, tc := range tests {
		var buf bytes.Buffer
		err := tc.chart.PNG(&buf)
		switch {
		case tc.err == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == errAny && err == nil, tc.err != nil && tc.err != errAny && !errors.Is(err, tc.err):
			t.Errorf("%s: got %v want %v", tc.name, err, tc.err)
		case tc.err == nil:
			img, err := png.Decode(&buf)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if b := img.Bounds(); b.Dx() != 720 || b.Dy() != 440 {
				t.Errorf("%s: size %v", tc.name, b)
			}
		}
	}
}

var errAny = errors.New("any error")

func TestTicksAreRoundAndInside(t *testing.T) {
	for _, r := range [][2]float64{{0, 1}, {0, 97}, {3, 60}, {-2, 5}, {0.001, 0.004}} {
		ts := ticks(r[0], r[1])
		if len(ts) < 3 || len(ts) > 11 {
			t.Errorf("%v: %d ticks %v", r, len(ts), ts)
		}
		for _, v := range ts {
			if v < r[0]-1e-9 || v > r[1]+1e-9 {
				t.Errorf("%v: tick %v outside", r, v)
			}
		}
	}
}

func TestLogTicksAreRound(t *testing.T) {
	for _, r := range [][2]float64{{0.003, 100}, {0.005, 0.008}, {1, 10}} {
		lo, hi := math.Log10(r[0]), math.Log10(r[1])
		ts := logTicks(lo, hi)
		if len(ts) < 4 {
			t.Errorf("%v: ticks %v", r, ts)
		}
		for _, v := range ts {
			if v < lo-1e-9 || v > hi+1e-9 {
				t.Errorf("%v: tick %v outside", r, math.Pow(10, v))
			}
		}
	}
}

func TestASCIIFallback(t *testing.T) {
	if got := fit("a × b — c\x01", 1000); got != "a x b - c?" {
		t.Errorf("got %q", got)
	}
	if got := fit("abcdefghij", 7*6); got != "abc..." {
		t.Errorf("got %q", got)
	}
}

// A scatter series draws its points without the segments between them.
func TestPointsAreNotJoined(t *testing.T) {
	coloured := func(points bool) int {
		c := Chart{Series: []Series{{Name: "s", X: []float64{0, 10, 20}, Y: []float64{0, 10, 0}, Points: points}}}
		img, err := c.Render()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		b := img.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				if img.RGBAAt(x, y) == palette[0] {
					n++
				}
			}
		}
		return n
	}
	lines, points := coloured(false), coloured(true)
	// Three 3×3 dots and the legend swatch, against two long segments.
	if points == 0 || lines < 3*points {
		t.Fatalf("%d series pixels as a line, %d as points", lines, points)
	}
}
