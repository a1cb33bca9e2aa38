package plot

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Series is one line: points (X[i], Y[i]) joined in order.
type Series struct {
	Name string
	X, Y []float64
	// Points draws the points alone, a scatter: for points whose order
	// means nothing.
	Points bool
}

// Chart is a line chart.
type Chart struct {
	Title, XLabel, YLabel string
	// LogY draws the y axis in log10; non-positive values are dropped.
	LogY   bool
	Series []Series
	// Width and Height default to 720×440 pixels.
	Width, Height int
}

// ErrNoData reports a chart with no drawable point.
var ErrNoData = errors.New("plot: no data")

// palette is distinguishable in colour and in greyscale order.
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff},
	{0xff, 0x7f, 0x0e, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

const (
	marginLeft   = 70
	marginRight  = 150
	marginTop    = 42
	marginBottom = 45
	maxPoints    = 1 << 20
)

// PNG renders the chart.
func (c Chart) PNG(w io.Writer) error {
	img, err := c.Render()
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// Render draws the chart into an image.
func (c Chart) Render() (*image.RGBA, error) {
	width, height := c.Width, c.Height
	if width <= 0 {
		width = 720
	}
	if height <= 0 {
		height = 440
	}
	if width < marginLeft+marginRight+50 || height < marginTop+marginBottom+50 || width*height > 1<<24 {
		return nil, fmt.Errorf("plot: size %d×%d out of range", width, height)
	}
	ys := func(v float64) (float64, bool) {
		if c.LogY {
			if v <= 0 {
				return 0, false
			}
			return math.Log10(v), true
		}
		return v, true
	}
	x0, x1, y0, y1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	points := 0
	for _, s := range c.Series {
		for i := range min(len(s.X), len(s.Y)) {
			y, ok := ys(s.Y[i])
			if !ok || !finite(s.X[i]) || !finite(y) {
				continue
			}
			x0, x1, y0, y1 = math.Min(x0, s.X[i]), math.Max(x1, s.X[i]), math.Min(y0, y), math.Max(y1, y)
			points++
		}
	}
	if points == 0 {
		return nil, ErrNoData
	}
	if points > maxPoints {
		return nil, fmt.Errorf("plot: %d points, more than %d", points, maxPoints)
	}
	if !c.LogY && y0 > 0 {
		y0 = 0 // linear axes start at zero so that bars of lines compare honestly
	}
	x0, x1 = widen(x0, x1)
	y0, y1 = widen(y0, y1)

	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	pl, pr, pt, pb := marginLeft, width-marginRight, marginTop, height-marginBottom
	px := func(x float64) float64 { return float64(pl) + (x-x0)/(x1-x0)*float64(pr-pl) }
	py := func(y float64) float64 { return float64(pb) - (y-y0)/(y1-y0)*float64(pb-pt) }

	grid := color.RGBA{0xe0, 0xe0, 0xe0, 0xff}
	black := color.RGBA{0, 0, 0, 0xff}
	for _, t := range ticks(x0, x1) {
		x := int(math.Round(px(t)))
		vline(img, x, pt, pb, grid)
		text(img, x-textWidth(label(t))/2, pb+16, label(t), black)
	}
	yt := ticks(y0, y1)
	if c.LogY {
		yt = logTicks(y0, y1)
	}
	for _, t := range yt {
		y := int(math.Round(py(t)))
		hline(img, pl, pr, y, grid)
		l := label(t)
		if c.LogY {
			l = label(math.Pow(10, t))
		}
		text(img, pl-6-textWidth(l), y+4, l, black)
	}
	hline(img, pl, pr, pb, black)
	vline(img, pl, pt, pb, black)
	title := fit(c.Title, width-8)
	text(img, max(4, (width-textWidth(title))/2), 16, title, black)
	text(img, (pl+pr-textWidth(c.XLabel))/2, height-10, c.XLabel, black)
	yl := c.YLabel
	if c.LogY {
		yl += " (log)"
	}
	text(img, 4, pt-10, yl, black)

	for si, s := range c.Series {
		col := palette[si%len(palette)]
		first := true
		var lx, ly float64
		for i := range min(len(s.X), len(s.Y)) {
			y, ok := ys(s.Y[i])
			if !ok || !finite(s.X[i]) || !finite(y) {
				continue
			}
			cx, cy := px(s.X[i]), py(y)
			if first || s.Points {
				dot(img, cx, cy, col)
			} else {
				line(img, lx, ly, cx, cy, col)
			}
			lx, ly, first = cx, cy, false
		}
		ly0 := pt + 10 + si*18
		for d := range 3 {
			hline(img, pr+10, pr+34, ly0+d-1, col)
		}
		text(img, pr+40, ly0+4, fit(s.Name, marginRight-44), black)
	}
	return img, nil
}

func finite(v float64) bool { return !math.IsInf(v, 0) && !math.IsNaN(v) }

func widen(lo, hi float64) (float64, float64) {
	if hi > lo {
		return lo, hi
	}
	d := math.Max(math.Abs(lo)*0.1, 1)
	return lo - d, hi + d
}

// ticks are 4–10 round values within [lo, hi].
func ticks(lo, hi float64) []float64 {
	span := hi - lo
	step := math.Pow(10, math.Floor(math.Log10(span)))
	for span/step < 4 {
		step /= 2
	}
	for span/step > 10 {
		step *= 2
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, t)
	}
	return out
}

// logTicks are 1-2-5 multiples of powers of ten within [lo, hi] (given in
// log10), or every integer multiple when that gives too few.
func logTicks(lo, hi float64) []float64 {
	for _, mults := range [][]float64{{1}, {1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
		var out []float64
		for e := math.Floor(lo); e <= math.Ceil(hi); e++ {
			for _, m := range mults {
				if v := e + math.Log10(m); v >= lo-1e-9 && v <= hi+1e-9 {
					out = append(out, v)
				}
			}
		}
		if len(out) >= 4 {
			return out
		}
	}
	return ticks(lo, hi)
}

func label(v float64) string {
	if math.Abs(v) < 1e-12 {
		return "0"
	}
	if math.Abs(v) >= 1 {
		// Plain digits up to a million: axis values read better as 12500
		// than as 1.25e+04.
		return strconv.FormatFloat(v, 'g', 7, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

var face = basicfont.Face7x13

func textWidth(s string) int { return font.MeasureString(face, ascii(s)).Round() }

func text(img *image.RGBA, x, y int, s string, col color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(col), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(ascii(s))
}

// ascii replaces what the bitmap font cannot draw.
func ascii(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '×':
			return 'x'
		case r == '—' || r == '–' || r == '→':
			return '-'
		case r < ' ' || r > '~':
			return '?'
		}
		return r
	}, s)
}

// fit shortens s to at most px pixels.
func fit(s string, px int) string {
	s = ascii(s)
	if n := px / textWidth("m"); len(s) > n && n > 3 {
		return s[:n-3] + "..."
	}
	return s
}

func hline(img *image.RGBA, x0, x1, y int, col color.RGBA) {
	for x := x0; x <= x1; x++ {
		img.SetRGBA(x, y, col)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, col color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, col)
	}
}

func dot(img *image.RGBA, x, y float64, col color.RGBA) {
	for dx := -1; dx <= 1; dx++ {
		for dy := -1; dy <= 1; dy++ {
			img.SetRGBA(int(x)+dx, int(y)+dy, col)
		}
	}
}

// line draws a two-pixel-wide segment by sampling along it.
func line(img *image.RGBA, x0, y0, x1, y1 float64, col color.RGBA) {
	n := int(math.Max(math.Abs(x1-x0), math.Abs(y1-y0))) + 1
	for i := 0; i <= n; i++ {
		t := float64(i) / float64(n)
		x, y := int(math.Round(x0+(x1-x0)*t)), int(math.Round(y0+(y1-y0)*t))
		img.SetRGBA(x, y, col)
		img.SetRGBA(x+1, y, col)
		img.SetRGBA(x, y+1, col)
	}
}
