package promtext

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
)

func TestMax(t *testing.T) {
	page := []byte(`# TYPE g gauge
g{a="1"} 3
g{a="2"} 7
g{a="3"} NaN
# TYPE c counter
c_total 5
u 9
`)
	all := func(*dto.Metric) bool { return true }
	only1 := func(m *dto.Metric) bool { return m.GetLabel()[0].GetValue() == "1" }
	for _, tc := range []struct {
		metric string
		keep   func(*dto.Metric) bool
		want   float64
		ok     bool
	}{
		{"g", all, 7, true},
		{"g", only1, 3, true},
		{"c_total", all, 5, true},
		{"u", all, 9, true},
		{"missing", all, 0, false},
		{"g", func(*dto.Metric) bool { return false }, 0, false},
	} {
		v, ok, err := Max(page, tc.metric, tc.keep)
		if err != nil || ok != tc.ok || v != tc.want {
			t.Errorf("%s: %v %v %v, want %v %v", tc.metric, v, ok, err, tc.want, tc.ok)
		}
	}
	if _, _, err := Max([]byte("g{a=1} x\n"), "g", all); err == nil {
		t.Error("a malformed page parsed")
	}
}

func FuzzMax(f *testing.F) {
	f.Add([]byte("g 1\n"), "g")
	f.Fuzz(func(t *testing.T, page []byte, metric string) {
		v, ok, err := Max(page, metric, func(*dto.Metric) bool { return true })
		if err == nil && !ok && v != 0 {
			t.Fatalf("no sample but value %v", v)
		}
	})
}
