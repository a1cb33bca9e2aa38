package mmcache

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"weak"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/endpointnotification"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/testutil"
)

func chat(t *testing.T, parts ...string) *scheduling.Request {
	t.Helper()
	body, err := openai.Parse(openai.ChatCompletions, []byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[`+strings.Join(parts, ",")+`]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	return &scheduling.Request{Body: body}
}

func image(url string) string { return `{"type":"image_url","image_url":{"url":"` + url + `"}}` }

func pair(t *testing.T, producerParams string) (*Producer, *Scorer) {
	t.Helper()
	pp, err := NewProducer(ProducerType, []byte(producerParams), nil)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := NewScorer("s", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := sp.(*Scorer)
	if err := s.Resolve(func(n string) (scheduling.Plugin, bool) { return pp, n == ProducerType }); err != nil {
		t.Fatal(err)
	}
	return pp.(*Producer), s
}

// route schedules req onto eps[target] and returns the scores it saw.
func route(t *testing.T, p *Producer, s *Scorer, req *scheduling.Request, eps []*endpoints.Endpoint, target int) []float64 {
	t.Helper()
	cs := scheduling.NewCycleState()
	p.Produce(context.Background(), cs, req, eps)
	scores := make([]float64, len(eps))
	s.Score(context.Background(), cs, req, eps, scores)
	p.PreRequest(context.Background(), cs, req, &scheduling.Result{PrimaryProfile: "d", Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: []*endpoints.Endpoint{eps[target]}}}})
	return scores
}

func fleet(n int) []*endpoints.Endpoint {
	var eps []*endpoints.Endpoint
	for i := range n {
		eps = append(eps, endpoints.NewEndpoint(endpoints.Spec{Name: fmt.Sprint(i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1)}))
	}
	return eps
}

func TestAffinity(t *testing.T) {
	p, s := pair(t, `{}`)
	eps := fleet(3)
	a, b := image("http://img/a.png"), image("http://img/b.png")
	steps := []struct {
		parts  []string
		target int
		want   []float64
	}{
		{[]string{a, b}, 0, []float64{0, 0, 0}},      // cold
		{[]string{a}, 1, []float64{1, 0, 0}},         // a was encoded on 0
		{[]string{a, b, a}, 2, []float64{1, 0.5, 0}}, // a repeated counts once
		{[]string{`{"type":"text","text":"no media"}`}, 0, []float64{0, 0, 0}},
		{[]string{`{"type":"video_url","video_url":{"url":"http://v/1.mp4"}}`, `{"type":"input_audio","input_audio":{"data":"UklG","format":"wav"}}`}, 1, []float64{0, 0, 0}},
		{[]string{`{"type":"input_audio","input_audio":{"data":"UklG","format":"wav"}}`}, 2, []float64{0, 1, 0}},
	}
	for i, st := range steps {
		got := route(t, p, s, chat(t, st.parts...), eps, st.target)
		for k := range got {
			if got[k] != st.want[k] {
				t.Fatalf("step %d: scores %v, want %v", i, got, st.want)
			}
		}
	}
	// A filtered candidate set: scores follow the subset.
	cs := scheduling.NewCycleState()
	req := chat(t, a)
	p.Produce(context.Background(), cs, req, eps)
	scores := make([]float64, 2)
	s.Score(context.Background(), cs, req, []*endpoints.Endpoint{eps[1], eps[2]}, scores)
	if scores[0] != 1 || scores[1] != 1 {
		t.Fatalf("subset scores %v", scores)
	}
	p.EndpointsRemoved([]string{eps[0].Address()})
	if got := route(t, p, s, chat(t, b), eps, 1); got[0] != 0 {
		t.Fatalf("a removed endpoint kept its items: %v", got)
	}
}

// TestCapacity: the per-endpoint LRU holds cacheSizeInMBPerServer/2 items,
// least recently routed out first.
func TestCapacity(t *testing.T) {
	p, s := pair(t, `{"cacheSizeInMBPerServer":4}`) // 2 items
	if p.capacity != 2 {
		t.Fatalf("capacity %d", p.capacity)
	}
	eps := fleet(1)
	for _, u := range []string{"a", "b", "a", "c"} { // b is the least recent when c comes
		route(t, p, s, chat(t, image(u)), eps, 0)
	}
	for u, want := range map[string]float64{"a": 1, "b": 0, "c": 1} {
		cs := scheduling.NewCycleState()
		req := chat(t, image(u))
		p.Produce(context.Background(), cs, req, eps)
		scores := make([]float64, 1)
		s.Score(context.Background(), cs, req, eps, scores)
		if scores[0] != want {
			t.Errorf("%s: score %v, want %v", u, scores[0], want)
		}
	}
	def, _ := NewProducer("", []byte(`{"cacheSizeInMBPerServer":0}`), nil)
	if def.(*Producer).capacity != 2048 {
		t.Errorf("default capacity %d, want 2048", def.(*Producer).capacity)
	}
}

func TestItems(t *testing.T) {
	anthropic, err := openai.Parse(openai.Messages, []byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}},{"type":"text","text":"x"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	completion, _ := openai.Parse(openai.Completions, []byte(`{"model":"m","prompt":"p"}`))
	for name, tc := range map[string]struct {
		body *openai.Request
		n    int
	}{
		"anthropic image": {anthropic, 1},
		"completions":     {completion, 0},
		"two distinct":    {chat(t, image("x"), image("y"), image("x")).Body, 2},
		"nil body":        {nil, 0},
	} {
		if got := len(Items(tc.body)); got != tc.n {
			t.Errorf("%s: %d items, want %d", name, got, tc.n)
		}
	}
}

func TestParams(t *testing.T) {
	if _, err := NewProducer("", []byte(`{"cacheSizeInMB":2048}`), nil); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("cacheSizeInMB: %v", err)
	}
	sp, _ := NewScorer("", []byte(`{"producerName":"other"}`), nil)
	if err := sp.(*Scorer).Resolve(func(string) (scheduling.Plugin, bool) { return nil, false }); err == nil || !strings.Contains(err.Error(), `"other" is not a configured plugin`) {
		t.Errorf("dangling producer: %v", err)
	}
	queue := scheduling.NewNamed("queue-scorer", "other")
	if err := sp.(*Scorer).Resolve(func(string) (scheduling.Plugin, bool) { return queue, true }); err == nil || !strings.Contains(err.Error(), "not a "+ProducerType) {
		t.Errorf("wrong producer type: %v", err)
	}
	pp, _ := NewProducer("", nil, nil)
	if err := pp.(*Producer).AcceptsSource(&endpointnotification.Source{Named: scheduling.NewNamed(endpointnotification.Type, "")}); err != nil {
		t.Errorf("endpoint notifications refused: %v", err)
	}
}

// TestDecisionDropsMatch: the request's items and what every candidate held
// of them are unreachable from the cycle state once PreRequest has run.
func TestDecisionDropsMatch(t *testing.T) {
	p, s := pair(t, "")
	eps := fleet(2)
	cs := scheduling.NewCycleState()
	req := chat(t, image("http://img/a.png"))
	p.Produce(context.Background(), cs, req, eps)
	s.Score(context.Background(), cs, req, eps, make([]float64, len(eps)))
	m, _ := scheduling.Read(cs, p.key)
	items, held := weak.Make(&m.items[0]), weak.Make(&m.held[0])
	p.PreRequest(context.Background(), cs, req, &scheduling.Result{PrimaryProfile: "d", Profiles: map[string]*scheduling.ProfileResult{"d": {Targets: eps[:1]}}})
	if !testutil.Collected(items) || !testutil.Collected(held) {
		t.Error("the match is reachable after the decision")
	}
	runtime.KeepAlive(cs)
}
