package gpuhealth

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/telemetry"
	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// table is GPU health by endpoint address, as the telemetry store would
// answer (the store itself is tested in extproc/telemetry, the whole path
// in extproc/epp's TestXIDErrorStopsTraffic).
type table map[string]telemetry.GPUHealth

func (t table) GPUHealth(ep string) (telemetry.GPUHealth, bool) { h, ok := t[ep]; return h, ok }

var now = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func handle(t *testing.T) *scheduling.Handle {
	s, err := telemetry.New(telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &scheduling.Handle{Now: func() time.Time { return now }, Services: map[string]any{telemetry.ServiceKey: s}}
}

func eps(addrs ...string) []*endpoints.Endpoint {
	out := make([]*endpoints.Endpoint, len(addrs))
	for i, a := range addrs {
		out[i] = endpoints.NewEndpoint(endpoints.Spec{Name: a, Address: a})
	}
	return out
}

func names(es []*endpoints.Endpoint) string {
	var s []string
	for _, e := range es {
		s = append(s, e.Address())
	}
	return strings.Join(s, ",")
}

var fleet = table{
	"ok:1":      {GPUs: 1},
	"xid:1":     {GPUs: 1, XIDErrors: 1, LastXID: 79, LastXIDTime: now.Add(-time.Minute)},
	"oldxid:1":  {GPUs: 1, XIDErrors: 1, LastXID: 79, LastXIDTime: now.Add(-time.Hour)},
	"appxid:1":  {GPUs: 1, XIDErrors: 3, LastXID: 43, LastXIDTime: now},
	"hot:1":     {GPUs: 1, ThrottleReasons: telemetryv1.ThrottleSWThermalSlowdown},
	"capped:1":  {GPUs: 1, ThrottleReasons: telemetryv1.ThrottleSWPowerCap},
	"hotslow:1": {GPUs: 1, ThrottleReasons: telemetryv1.ThrottleHWThermalSlowdown | telemetryv1.ThrottleHWSlowdown | telemetryv1.ThrottleSWPowerCap},
}

func TestFilter(t *testing.T) {
	for _, tc := range []struct {
		params string
		in     []string
		want   string
	}{
		{``, []string{"ok:1", "xid:1", "oldxid:1", "appxid:1", "hot:1", "capped:1", "unknown:1"}, "ok:1,oldxid:1,appxid:1,capped:1,unknown:1"},
		{`{"throttle": []}`, []string{"xid:1", "hot:1"}, "hot:1"},
		{`{"throttle": ["power"]}`, []string{"hot:1", "capped:1", "hotslow:1"}, "hot:1"},
		{`{"xidWindow": "2h"}`, []string{"ok:1", "oldxid:1"}, "ok:1"},
		{`{"ignoreXIDs": []}`, []string{"ok:1", "appxid:1"}, "ok:1"},
		// Every candidate unhealthy: all are kept (health-blind, not down).
		{``, []string{"xid:1", "hot:1"}, "xid:1,hot:1"},
	} {
		t.Run(tc.params+" "+strings.Join(tc.in, ","), func(t *testing.T) {
			p, err := NewFilter("", json.RawMessage(tc.params), handle(t))
			if err != nil {
				t.Fatal(err)
			}
			f := p.(*Filter)
			f.health = fleet
			if got := names(f.Filter(t.Context(), nil, nil, eps(tc.in...))); got != tc.want {
				t.Errorf("kept %s, want %s", got, tc.want)
			}
		})
	}
}

func TestScorer(t *testing.T) {
	for _, tc := range []struct {
		params string
		ep     string
		want   float64
	}{
		{``, "ok:1", 1},
		{``, "unknown:1", 1},
		{``, "xid:1", 0},
		{``, "oldxid:1", 1},
		{``, "hot:1", 0.5},
		{``, "capped:1", 0.7},
		{``, "hotslow:1", 0},
		{`{"thermalPenalty": 0.2, "powerPenalty": 0, "hwSlowdownPenalty": 0.1}`, "hotslow:1", 0.7},
	} {
		t.Run(tc.params+" "+tc.ep, func(t *testing.T) {
			p, err := NewScorer("", json.RawMessage(tc.params), handle(t))
			if err != nil {
				t.Fatal(err)
			}
			s := p.(*Scorer)
			s.health = fleet
			scores := make([]float64, 1)
			s.Score(t.Context(), nil, nil, eps(tc.ep), scores)
			if d := scores[0] - tc.want; d > 1e-9 || d < -1e-9 {
				t.Errorf("score %v, want %v", scores[0], tc.want)
			}
		})
	}
}

func TestBadParams(t *testing.T) {
	for _, tc := range []struct {
		f      scheduling.Factory
		params string
		want   string
	}{
		{NewFilter, `{"throttle": ["cold"]}`, "unknown group"},
		{NewFilter, `{"xidWindow": "-1m"}`, "must be positive"},
		{NewFilter, `{"xidWindw": "1m"}`, "xidWindw"},
		{NewScorer, `{"powerPenalty": 2}`, "must be in [0, 1]"},
	} {
		if _, err := tc.f("", json.RawMessage(tc.params), handle(t)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.params, err, tc.want)
		}
	}
	for _, f := range []scheduling.Factory{NewFilter, NewScorer} {
		if _, err := f("", nil, &scheduling.Handle{}); err == nil || !strings.Contains(err.Error(), "telemetry stream") {
			t.Errorf("built without telemetry: %v", err)
		}
	}
}
