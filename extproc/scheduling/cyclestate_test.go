package scheduling_test

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestCycleStateKeys(t *testing.T) {
	cs := scheduling.NewCycleState()
	a := scheduling.NewKey[*int]("same")
	b := scheduling.NewKey[*int]("same")
	if _, ok := scheduling.Read(cs, a); ok {
		t.Fatal("empty state read a value")
	}
	one, two := 1, 2
	scheduling.Write(cs, a, &one)
	scheduling.Write(cs, b, &two)
	if v, ok := scheduling.Read(cs, a); !ok || *v != 1 {
		t.Fatalf("a = %v, %v; keys with one name must not collide", v, ok)
	}
	if v, ok := scheduling.Read(cs, b); !ok || *v != 2 {
		t.Fatalf("b = %v, %v", v, ok)
	}
	scheduling.Write(cs, a, &two)
	if v, _ := scheduling.Read(cs, a); *v != 2 {
		t.Fatalf("rewritten a = %d", *v)
	}
	if _, ok := scheduling.Read(cs, scheduling.Key[*int]{}); ok {
		t.Fatal("the zero key read a value")
	}
	if _, ok := scheduling.Read(&scheduling.CycleState{}, a); ok {
		t.Fatal("the zero state read a value")
	}
}

// More keys than the inline slots still each keep their value.
func TestCycleStateOverflow(t *testing.T) {
	cs := scheduling.NewCycleState()
	keys := make([]scheduling.Key[string], 20)
	for i := range keys {
		keys[i] = scheduling.NewKey[string](fmt.Sprint(i))
		scheduling.Write(cs, keys[i], fmt.Sprint("v", i))
	}
	for i, k := range keys {
		if v, ok := scheduling.Read(cs, k); !ok || v != fmt.Sprint("v", i) {
			t.Fatalf("key %s = %q, %v", k, v, ok)
		}
	}
}

func TestCycleStateZeroKeyWritePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Write with the zero key did not panic")
		}
	}()
	scheduling.Write(scheduling.NewCycleState(), scheduling.Key[*int]{}, nil)
}

// A request's few pointer values cost no allocation beyond the state itself.
func TestCycleStateAllocations(t *testing.T) {
	keys := []scheduling.Key[*int]{scheduling.NewKey[*int]("a"), scheduling.NewKey[*int]("b"), scheduling.NewKey[*int]("c")}
	v := new(int)
	cs := new(scheduling.CycleState)
	allocs := testing.AllocsPerRun(100, func() {
		*cs = scheduling.CycleState{}
		for _, k := range keys {
			scheduling.Write(cs, k, v)
		}
		for _, k := range keys {
			if _, ok := scheduling.Read(cs, k); !ok {
				t.Fatal("lost a value")
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per cycle, want 0", allocs)
	}
}

// recycled counts its Recycle calls.
type recycled struct{ n int }

func (r *recycled) Recycle() { r.n++ }

// Release recycles every Recycler stored, inline or overflowing, once, and
// the state comes back empty; values that are not Recyclers are only
// dropped.
func TestCycleStateRelease(t *testing.T) {
	cs := scheduling.AcquireCycleState()
	var vals []*recycled
	for i := range 6 { // more than the inline slots
		v := &recycled{}
		vals = append(vals, v)
		scheduling.Write(cs, scheduling.NewKey[*recycled](fmt.Sprint(i)), v)
	}
	plain := scheduling.NewKey[*int]("plain")
	scheduling.Write(cs, plain, new(int))
	r := scheduling.NewResult(cs)
	r.PrimaryProfile = "p"
	pr := scheduling.NewProfileResult(cs, 2)
	if len(pr.Targets) != 2 {
		t.Fatalf("%d targets, want 2", len(pr.Targets))
	}
	cs.Release()
	for i, v := range vals {
		if v.n != 1 {
			t.Errorf("value %d recycled %d times, want 1", i, v.n)
		}
	}
	if _, ok := scheduling.Read(cs, plain); ok {
		t.Error("a released state still holds a value")
	}
	if got := scheduling.NewResult(cs); got.PrimaryProfile != "" || got.Profiles != nil {
		t.Errorf("a released state's result = %+v, want empty", got)
	}
}

// decidedValue counts its Decided and Recycle calls.
type decidedValue struct{ decided, recycled int }

func (d *decidedValue) Decided() { d.decided++ }
func (d *decidedValue) Recycle() { d.recycled++ }

// Decided tells every DecisionScoped value stored, inline or overflowing,
// once per call, recycles nothing and keeps the values readable; values
// that are not DecisionScoped are left alone.
func TestCycleStateDecided(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values int
	}{
		{"inline", 2},
		{"overflowing", 6}, // more than the inline slots
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := scheduling.AcquireCycleState()
			var vals []*decidedValue
			var keys []scheduling.Key[*decidedValue]
			for i := range tc.values {
				v := &decidedValue{}
				k := scheduling.NewKey[*decidedValue](fmt.Sprint(i))
				vals, keys = append(vals, v), append(keys, k)
				scheduling.Write(cs, k, v)
			}
			plain := scheduling.NewKey[*recycled]("plain")
			other := &recycled{}
			scheduling.Write(cs, plain, other)
			cs.Decided()
			for i, v := range vals {
				if v.decided != 1 || v.recycled != 0 {
					t.Errorf("value %d: decided %d, recycled %d times, want 1, 0", i, v.decided, v.recycled)
				}
				if got, ok := scheduling.Read(cs, keys[i]); !ok || got != v {
					t.Errorf("value %d unreadable after Decided", i)
				}
			}
			if other.n != 0 {
				t.Errorf("Decided recycled a Recycler %d times", other.n)
			}
			cs.Release()
			for i, v := range vals {
				if v.decided != 1 || v.recycled != 1 {
					t.Errorf("value %d after Release: decided %d, recycled %d times, want 1, 1", i, v.decided, v.recycled)
				}
			}
		})
	}
}

// Results made from one state do not share storage: a second result's
// targets, or a second ProcessResults, leave the first intact.
func TestCycleStateResultsDistinct(t *testing.T) {
	cs := scheduling.NewCycleState()
	var prs []*scheduling.ProfileResult
	for i := range 5 { // past the inline results and the first targets array
		pr := scheduling.NewProfileResult(cs, i+1)
		for k := range pr.Targets {
			pr.Targets[k] = &endpoints.Endpoint{}
		}
		prs = append(prs, pr)
	}
	for i, pr := range prs {
		if len(pr.Targets) != i+1 || cap(pr.Targets) != i+1 {
			t.Fatalf("result %d: %d targets (cap %d), want %d", i, len(pr.Targets), cap(pr.Targets), i+1)
		}
		for j, q := range prs[:i] {
			if &q.Targets[0] == &pr.Targets[0] || q == pr {
				t.Fatalf("results %d and %d share storage", j, i)
			}
		}
	}
	if a, b := scheduling.NewResult(cs), scheduling.NewResult(cs); a == b {
		t.Fatal("two results of one state are the same")
	}
	if scheduling.NewResult(nil) == nil || scheduling.NewProfileResult(nil, 1) == nil || len(scheduling.OneProfile(nil, &scheduling.Profile{})) != 1 {
		t.Fatal("a nil state must still give results")
	}
}
