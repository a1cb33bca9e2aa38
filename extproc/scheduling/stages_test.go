package scheduling_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// producer records the order producers ran in and declares its keys.
type producer struct {
	scheduling.Named
	produces, consumes []string
	ran                *[]string
}

func (p *producer) Produce(context.Context, *scheduling.CycleState, *scheduling.Request, []*endpoints.Endpoint) {
	*p.ran = append(*p.ran, p.TypedName().Name)
}
func (p *producer) Produces() []string { return p.produces }
func (p *producer) Consumes() []string { return p.consumes }

func TestOrderProducers(t *testing.T) {
	mk := func(name string, produces, consumes []string) scheduling.DataProducer {
		return &producer{Named: scheduling.NewNamed("p", name), produces: produces, consumes: consumes}
	}
	tests := []struct {
		name    string
		in      []scheduling.DataProducer
		want    []string
		wantErr string
	}{
		{name: "independent keep configuration order", in: []scheduling.DataProducer{mk("a", nil, nil), mk("b", nil, nil)}, want: []string{"a", "b"}},
		{name: "consumer moves after its producer", in: []scheduling.DataProducer{
			mk("latency", []string{"lat"}, []string{"prefix", "load"}), mk("load", []string{"load"}, nil), mk("prefix", []string{"prefix"}, nil),
		}, want: []string{"load", "prefix", "latency"}},
		{name: "chain", in: []scheduling.DataProducer{mk("c", nil, []string{"y"}), mk("b", []string{"y"}, []string{"x"}), mk("a", []string{"x"}, nil)}, want: []string{"a", "b", "c"}},
		{name: "two producers of one key both run first", in: []scheduling.DataProducer{
			mk("latency", nil, []string{"prefix"}), mk("precise", []string{"prefix"}, nil), mk("approx", []string{"prefix"}, nil),
		}, want: []string{"precise", "approx", "latency"}},
		{name: "absent input is optional", in: []scheduling.DataProducer{mk("a", nil, []string{"nobody"})}, want: []string{"a"}},
		{name: "cycle", in: []scheduling.DataProducer{mk("a", []string{"x"}, []string{"y"}), mk("b", []string{"y"}, []string{"x"})}, wantErr: "cycle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := scheduling.OrderProducers(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range got {
				names = append(names, p.TypedName().Name)
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("order %v, want %v", names, tt.want)
			}
		})
	}
}

// admitter refuses every request when closed.
type admitter struct {
	scheduling.Named
	closed bool
	sawLen *int
}

var errClosed = errors.New("closed")

func (a *admitter) Admit(_ context.Context, _ *scheduling.CycleState, _ *scheduling.Request, eps []*endpoints.Endpoint) error {
	*a.sawLen = len(eps)
	if a.closed {
		return errClosed
	}
	return nil
}

// Producers run once per request over every candidate, before admitters
// and profiles; a refusal ends scheduling with ErrNotAdmitted.
func TestSchedulerStages(t *testing.T) {
	for _, closed := range []bool{false, true} {
		var ran []string
		saw := 0
		p := &scheduling.Profile{Name: "default", Scorers: []scheduling.WeightedScorer{{Scorer: &fixed{Named: scheduling.NewNamed("f", "f"), scores: map[string]float64{"a": 1}}, Weight: 1}},
			Filters: []scheduling.Filter{&keep{Named: scheduling.NewNamed("k", "k"), names: map[string]bool{"a": true}}}, Picker: maxPicker(t, "1")}
		s := scheduling.NewScheduler(single(t), map[string]*scheduling.Profile{"default": p}, nil, scheduling.Stages{
			Producers: []scheduling.DataProducer{&producer{Named: scheduling.NewNamed("p", "p1"), ran: &ran}, &producer{Named: scheduling.NewNamed("p", "p2"), ran: &ran}},
			Admitters: []scheduling.Admitter{&admitter{Named: scheduling.NewNamed("adm", "adm"), closed: closed, sawLen: &saw}},
		})
		eps := []*endpoints.Endpoint{schedtest.Endpoint("a", endpoints.Metrics{}), schedtest.Endpoint("b", endpoints.Metrics{})}
		res, err := s.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{}, eps)
		if !slices.Equal(ran, []string{"p1", "p2"}) || saw != 2 {
			t.Fatalf("producers ran %v, admitter saw %d candidates", ran, saw)
		}
		if closed {
			if !errors.Is(err, scheduling.ErrNotAdmitted) || !errors.Is(err, errClosed) {
				t.Fatalf("closed admitter: err = %v", err)
			}
			continue
		}
		if err != nil || res.Primary().Targets[0].Name() != "a" {
			t.Fatalf("open admitter: %v, %+v", err, res)
		}
	}
}
