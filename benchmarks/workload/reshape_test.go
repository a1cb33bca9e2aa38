package workload

import (
	"testing"
	"time"
)

func TestReshape(t *testing.T) {
	// One request per second for 100 s.
	var reqs []Request
	for i := range 100 {
		reqs = append(reqs, Request{Arrival: time.Duration(i) * time.Second, OutputTokens: i + 1})
	}
	out, err := Reshape(reqs, []float64{1, 4, 0.5}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// 10 s at 1×, 10 s at 4× and 10 s at 0.5× replay 10 + 40 + 5 seconds.
	if len(out) != 55 {
		t.Fatalf("%d requests, want 55", len(out))
	}
	perStage := [3]int{}
	for i, r := range out {
		if i > 0 && r.Arrival < out[i-1].Arrival {
			t.Fatalf("arrivals out of order at %d", i)
		}
		if r.OutputTokens != i+1 {
			t.Fatalf("request %d is the original %d: the order changed", i, r.OutputTokens-1)
		}
		perStage[int(r.Arrival/(10*time.Second))]++
	}
	if perStage != [3]int{10, 40, 5} {
		t.Errorf("requests per stage %v, want [10 40 5]", perStage)
	}
	for _, bad := range [][]float64{nil, {1, 0}, {-1}} {
		if _, err := Reshape(reqs, bad, time.Second); err == nil {
			t.Errorf("factors %v accepted", bad)
		}
	}
	if _, err := Reshape(reqs, []float64{1}, 0); err == nil {
		t.Error("zero stage duration accepted")
	}
}
