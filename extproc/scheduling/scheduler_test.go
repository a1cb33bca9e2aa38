package scheduling_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/picker"
	"github.com/kvgate/kvgate/extproc/plugins/profilehandler"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// fixed scores each endpoint from a table by name.
type fixed struct {
	scheduling.Named
	scores map[string]float64
}

func (f *fixed) Score(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint, out []float64) {
	for i, e := range eps {
		out[i] = f.scores[e.Name()]
	}
}

// keep filters endpoints by name.
type keep struct {
	scheduling.Named
	names map[string]bool
}

func (k *keep) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) []*endpoints.Endpoint {
	out := eps[:0]
	for _, e := range eps {
		if k.names[e.Name()] {
			out = append(out, e)
		}
	}
	return out
}

func maxPicker(t *testing.T, n string) scheduling.Picker {
	p, err := picker.NewMaxScore("", []byte(`{"maxNumOfEndpoints":`+n+`}`), &scheduling.Handle{})
	if err != nil {
		t.Fatal(err)
	}
	return p.(scheduling.Picker)
}

func single(t *testing.T) scheduling.ProfileHandler {
	h, err := profilehandler.NewSingle("", nil, &scheduling.Handle{})
	if err != nil {
		t.Fatal(err)
	}
	return h.(scheduling.ProfileHandler)
}

func TestProfileRun(t *testing.T) {
	eps := []*endpoints.Endpoint{
		schedtest.Endpoint("a", endpoints.Metrics{}),
		schedtest.Endpoint("b", endpoints.Metrics{}),
		schedtest.Endpoint("c", endpoints.Metrics{}),
	}
	tests := []struct {
		name    string
		filters []scheduling.Filter
		scorers []scheduling.WeightedScorer
		want    string
		err     error
	}{
		{
			name: "weighted sum decides",
			scorers: []scheduling.WeightedScorer{
				{Scorer: &fixed{scores: map[string]float64{"a": 1, "b": 0, "c": 0.5}}, Weight: 1},
				{Scorer: &fixed{scores: map[string]float64{"a": 0, "b": 1, "c": 0.5}}, Weight: 3},
			},
			want: "bca",
		},
		{
			name: "out-of-range scores are clamped",
			scorers: []scheduling.WeightedScorer{
				{Scorer: &fixed{scores: map[string]float64{"a": 100, "b": 0.9, "c": math.NaN()}}, Weight: 1},
				{Scorer: &fixed{scores: map[string]float64{"a": 0, "b": 0.2, "c": -5}}, Weight: 1},
			},
			want: "bac",
		},
		{
			name:    "filter narrows",
			filters: []scheduling.Filter{&keep{names: map[string]bool{"c": true}}},
			scorers: []scheduling.WeightedScorer{{Scorer: &fixed{scores: map[string]float64{"a": 1}}, Weight: 1}},
			want:    "c",
		},
		{
			name:    "filter removes all",
			filters: []scheduling.Filter{&keep{}},
			err:     scheduling.ErrAllFiltered,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &scheduling.Profile{Name: "default", Filters: tc.filters, Scorers: tc.scorers, Picker: maxPicker(t, "3")}
			s := scheduling.NewScheduler(single(t), map[string]*scheduling.Profile{"default": p}, nil, scheduling.Stages{})
			in := append([]*endpoints.Endpoint(nil), eps...)
			res, err := s.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, in)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			for i := range eps {
				if in[i] != eps[i] {
					t.Fatal("scheduler modified the caller's candidate slice")
				}
			}
			if tc.err != nil {
				return
			}
			got := ""
			for _, e := range res.Primary().Targets {
				got += e.Name()
			}
			if got != tc.want {
				t.Fatalf("targets %q, want %q", got, tc.want)
			}
		})
	}
}

func TestScheduleNoCandidates(t *testing.T) {
	p := &scheduling.Profile{Name: "default", Picker: maxPicker(t, "1")}
	s := scheduling.NewScheduler(single(t), map[string]*scheduling.Profile{"default": p}, nil, scheduling.Stages{})
	if _, err := s.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, nil); !errors.Is(err, scheduling.ErrNoCandidates) {
		t.Fatalf("err = %v", err)
	}
}

// endless never stops choosing profiles; the scheduler must not hang.
type endless struct{ scheduling.Named }

func (endless) Pick(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, profiles map[string]*scheduling.Profile, results map[string]*scheduling.ProfileResult) []*scheduling.Profile {
	for name, p := range profiles {
		if _, ran := results[name]; !ran {
			return []*scheduling.Profile{p}
		}
	}
	return []*scheduling.Profile{profiles["default"]}
}

func (endless) ProcessResults(context.Context, *scheduling.CycleState, *scheduling.Request, map[string]*scheduling.ProfileResult) (*scheduling.Result, error) {
	return nil, errors.New("unreachable")
}

func TestScheduleHandlerMustFinish(t *testing.T) {
	p := &scheduling.Profile{Name: "default", Picker: maxPicker(t, "1")}
	s := scheduling.NewScheduler(endless{}, map[string]*scheduling.Profile{"default": p}, nil, scheduling.Stages{})
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{})}
	if _, err := s.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, eps); err == nil {
		t.Fatal("a handler choosing a profile twice must fail the request")
	}
}

// emptyPrimary is a handler whose result names a primary profile with no
// target.
type emptyPrimary struct{ scheduling.Named }

func (emptyPrimary) Pick(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, profiles map[string]*scheduling.Profile, results map[string]*scheduling.ProfileResult) []*scheduling.Profile {
	if len(results) == 0 {
		return []*scheduling.Profile{profiles["default"]}
	}
	return nil
}

func (emptyPrimary) ProcessResults(context.Context, *scheduling.CycleState, *scheduling.Request, map[string]*scheduling.ProfileResult) (*scheduling.Result, error) {
	return &scheduling.Result{PrimaryProfile: "default", Profiles: map[string]*scheduling.ProfileResult{"default": {}}}, nil
}

// A result whose primary has no target is no decision: the director reads
// the first target of every successful one.
func TestScheduleEmptyPrimaryFails(t *testing.T) {
	p := &scheduling.Profile{Name: "default", Picker: maxPicker(t, "1")}
	s := scheduling.NewScheduler(emptyPrimary{}, map[string]*scheduling.Profile{"default": p}, nil, scheduling.Stages{})
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{})}
	if res, err := s.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, eps); !errors.Is(err, scheduling.ErrAllFiltered) {
		t.Fatalf("Schedule = %+v, %v; want ErrAllFiltered", res, err)
	}
}

func TestObserverSeesEveryPlugin(t *testing.T) {
	sc := &fixed{Named: scheduling.NewNamed("fixed", "f1")}
	p := &scheduling.Profile{Name: "default", Scorers: []scheduling.WeightedScorer{{Scorer: sc, Weight: 1}}, Picker: maxPicker(t, "1")}
	seen := map[string]int{}
	s := scheduling.NewScheduler(single(t), map[string]*scheduling.Profile{"default": p}, func(point string, tn scheduling.TypedName, _ time.Duration) {
		seen[point+"/"+tn.Name]++
	}, scheduling.Stages{})
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{})}
	if _, err := s.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, eps); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"Scorer/f1", "Picker/max-score-picker", "ProfileHandler/single-profile-handler"} {
		if seen[k] == 0 {
			t.Fatalf("observer missed %s: %v", k, seen)
		}
	}
}

// A cycle scheduled twice keeps its first decision intact (the second
// gets its own results), and a released state's next cycle decides
// afresh, whatever the one before it chose.
func TestScheduleReusesCycleStorage(t *testing.T) {
	eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
	prefer := func(name string) *scheduling.Scheduler {
		p := &scheduling.Profile{Name: "default", Picker: maxPicker(t, "1"),
			Scorers: []scheduling.WeightedScorer{{Scorer: &fixed{scores: map[string]float64{name: 1}}, Weight: 1}}}
		return scheduling.NewScheduler(single(t), map[string]*scheduling.Profile{"default": p}, nil, scheduling.Stages{})
	}
	ctx := context.Background()
	cs := scheduling.AcquireCycleState()
	first, err := prefer("a").Schedule(ctx, cs, &scheduling.Request{}, eps)
	if err != nil {
		t.Fatal(err)
	}
	second, err := prefer("b").Schedule(ctx, cs, &scheduling.Request{}, eps)
	if err != nil {
		t.Fatal(err)
	}
	if got := first.Primary().Targets[0].Name(); got != "a" {
		t.Errorf("first decision = %s after a second on its state, want a", got)
	}
	if got := second.Primary().Targets[0].Name(); got != "b" {
		t.Errorf("second decision = %s, want b", got)
	}
	cs.Release()
	for range 3 {
		cs := scheduling.AcquireCycleState()
		res, err := prefer("b").Schedule(ctx, cs, &scheduling.Request{}, eps)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(res.Profiles); n != 1 || res.Primary().Targets[0].Name() != "b" {
			t.Fatalf("decision on a recycled state: %d profiles, primary %s", n, res.Primary().Targets[0].Name())
		}
		cs.Release()
	}
}
