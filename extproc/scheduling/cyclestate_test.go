package scheduling_test

import (
	"fmt"
	"testing"

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
