package scrape

import (
	"errors"
	"testing"
)

func TestSums(t *testing.T) {
	page := []byte(`# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 2
vllm:num_requests_waiting{model_name="b",engine="1"} 3
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="a"} 40 1700000000000
{"vllm:prompt_tokens_total",model_name="a"} 7
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 9
not a { valid line
`)
	got, err := Sums(page, "vllm:num_requests_waiting", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total", "vllm:absent")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"vllm:num_requests_waiting": 5, "vllm:prefix_cache_hits_total": 40, "vllm:prompt_tokens_total": 7}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	// A malformed line of a series asked for is an error naming it.
	_, err = Sums([]byte("x 1\ny{a=\"b} 2\n"), "y")
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 2 || pe.Metric != "y" {
		t.Fatalf("err = %v, want a ParseError on line 2 for y", err)
	}
	// Without names every series is read.
	all, err := Sums([]byte("a 1\nb{x=\"y\"} 2\nb 3\n"))
	if err != nil || all["a"] != 1 || all["b"] != 5 {
		t.Fatalf("all series: %v, %v", all, err)
	}
}

// FuzzSums: any page is read or refused with a *ParseError, never a
// panic; a series read with every name asked for is read alike when only
// its own name is (checked for a few names: each check reads the page).
func FuzzSums(f *testing.F) {
	for _, name := range []string{"vllm.txt", "sglang.txt"} {
		f.Add(readFixture(f, name))
	}
	f.Add([]byte("x 1\ny{a=\"b} 2\n"))
	f.Add([]byte(`{"vllm:num_requests_waiting",a="\\\"\n"} 1` + "\n" + "z{} NaN\n"))
	f.Fuzz(func(t *testing.T, page []byte) {
		all, err := Sums(page)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Sums: %v is not a *ParseError", err)
			}
			return
		}
		checked := 0
		for name, v := range all {
			if checked++; checked > 4 {
				break
			}
			one, err := Sums(page, name)
			if err != nil {
				t.Fatalf("Sums(%q) refused what Sums() read: %v", name, err)
			}
			if w := one[name]; w != v && !(w != w && v != v) {
				t.Fatalf("Sums(%q) = %v, Sums() read %v", name, w, v)
			}
		}
	})
}
