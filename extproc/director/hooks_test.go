package director

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// recordingAdmission dispatches at once and records the flows it saw.
type recordingAdmission struct{ flows []string }

func (a *recordingAdmission) Admit(_ context.Context, req flowcontrol.Request, dispatch func(*flowcontrol.Item)) error {
	a.flows = append(a.flows, req.FairnessID)
	dispatch(nil)
	return nil
}
func (a *recordingAdmission) Notify()                         {}
func (a *recordingAdmission) Track(*flowcontrol.Item, func()) {}
func (a *recordingAdmission) Finished(*flowcontrol.Item)      {}

// RequestHeader hooks run before flow control: agent-identity's session
// id is the flow the request queues in, unless the client names one.
func TestRequestHeaderHooksBeforeFlowControl(t *testing.T) {
	built := buildConfig(t, "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: agent-identity\n- type: random-picker\n", &scheduling.Handle{})
	adm := &recordingAdmission{}
	d := New(Options{Pool: pool{schedtest.Endpoint("a", endpoints.Metrics{})}, Scheduler: built.Scheduler, Admission: adm,
		Hooks: Hooks{RequestHeader: built.RequestHeader}})
	for _, h := range []map[string]string{
		{"x-claude-code-session-id": "session-1"},
		{"x-claude-code-session-id": "session-1", eppwire.HeaderFairnessID: "tenant"},
		{},
	} {
		req := completion("p", false)
		req.Headers = h
		req.FairnessID = h[eppwire.HeaderFairnessID]
		if req.FairnessID == "" {
			req.FairnessID = "default-flow"
		}
		_, ex, err := d.HandleRequest(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		ex.ResponseDone(context.Background(), server.ResponseSummary{})
	}
	if got := fmt.Sprint(adm.flows); got != "[session-1 tenant default-flow]" {
		t.Fatalf("flows %s", got)
	}
	req := completion("p", false)
	req.Headers = map[string]string{"session-id": "codex"}
	if sr, fr := d.Classify(req); sr.FairnessID != "codex" || fr.FairnessID != "codex" {
		t.Fatalf("Classify: %q %q", sr.FairnessID, fr.FairnessID)
	}
}

// eventLog is what orderAdmission and orderHook saw, in order.
type eventLog []string

// orderAdmission dispatches at once, as a tracked flow, and logs the
// wake-ups the director gives it.
type orderAdmission struct{ log *eventLog }

func (a orderAdmission) Admit(_ context.Context, _ flowcontrol.Request, dispatch func(*flowcontrol.Item)) error {
	dispatch(new(flowcontrol.Item))
	return nil
}
func (a orderAdmission) Notify()                         { *a.log = append(*a.log, "notify") }
func (a orderAdmission) Track(*flowcontrol.Item, func()) {}
func (a orderAdmission) Finished(*flowcontrol.Item)      { *a.log = append(*a.log, "finished") }

type orderHook struct{ log *eventLog }

func (h orderHook) TypedName() scheduling.TypedName {
	return scheduling.TypedName{Type: "order-hook", Name: "order-hook"}
}
func (h orderHook) FirstToken(context.Context, *scheduling.CycleState, *scheduling.Request, *scheduling.Response) {
	*h.log = append(*h.log, "first-token hook")
}
func (h orderHook) ResponseComplete(context.Context, *scheduling.CycleState, *scheduling.Request, *scheduling.Response) {
	*h.log = append(*h.log, "complete hook")
}

// Flow control is woken only after the hooks have run: a plugin that
// counts load (class-load-scorer, read by presence-holdback-policy) has
// released the request's share by the time the dispatch pass looks.
func TestAdmissionWokenAfterHooks(t *testing.T) {
	built := buildConfig(t, "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: random-picker\n", &scheduling.Handle{})
	var log eventLog
	h := orderHook{&log}
	d := New(Options{Pool: pool{schedtest.Endpoint("a", endpoints.Metrics{})}, Scheduler: built.Scheduler,
		Admission: orderAdmission{&log}, Hooks: Hooks{FirstToken: []scheduling.FirstToken{h}, ResponseComplete: []scheduling.ResponseComplete{h}}})
	_, ex, err := d.HandleRequest(context.Background(), completion("p", true))
	if err != nil {
		t.Fatal(err)
	}
	ex.ResponseChunk(context.Background(), []byte("data: {}\n\n"))
	ex.ResponseDone(context.Background(), server.ResponseSummary{Status: 200, Complete: true})
	if got, want := fmt.Sprint(log), "[first-token hook notify complete hook finished]"; got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
}

// decisionValue is a plugin's per-request value that logs when it is told
// the decision is made.
type decisionValue struct{ log *eventLog }

func (v decisionValue) Decided() { *v.log = append(*v.log, "decided") }

var decisionKey = scheduling.NewKey[*decisionValue]("decision-value")

// orderPreRequest logs its PreRequest (the first writes the value, the
// others read it) and its Hold, which lets the request go at once.
type orderPreRequest struct {
	scheduling.Named
	log   *eventLog
	write bool
}

func (h orderPreRequest) PreRequest(_ context.Context, cs *scheduling.CycleState, _ *scheduling.Request, _ *scheduling.Result) {
	if h.write {
		scheduling.Write(cs, decisionKey, &decisionValue{h.log})
	}
	_, ok := scheduling.Read(cs, decisionKey)
	*h.log = append(*h.log, fmt.Sprintf("%s reads %v", h.TypedName().Name, ok))
}

func (h orderPreRequest) Hold(*scheduling.CycleState) (<-chan struct{}, time.Duration) {
	*h.log = append(*h.log, h.TypedName().Name+" hold")
	return nil, 0
}

// The cycle state is told the decision is made once, after every
// PreRequest and Hold hook and before the response hooks: a value a later
// plugin's PreRequest reads is still whole there.
func TestDecidedAfterPreRequestAndHold(t *testing.T) {
	built := buildConfig(t, "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: random-picker\n", &scheduling.Handle{})
	var log eventLog
	first := orderPreRequest{Named: scheduling.NewNamed("order", "first"), log: &log, write: true}
	second := orderPreRequest{Named: scheduling.NewNamed("order", "second"), log: &log}
	h := orderHook{&log}
	d := New(Options{Pool: pool{schedtest.Endpoint("a", endpoints.Metrics{})}, Scheduler: built.Scheduler,
		Hooks: Hooks{PreRequest: []scheduling.PreRequest{first, second}, Hold: []scheduling.Holder{first, second},
			FirstToken: []scheduling.FirstToken{h}, ResponseComplete: []scheduling.ResponseComplete{h}}})
	_, ex, err := d.HandleRequest(context.Background(), completion("p", true))
	if err != nil {
		t.Fatal(err)
	}
	ex.ResponseChunk(context.Background(), []byte("data: {}\n\n"))
	ex.ResponseDone(context.Background(), server.ResponseSummary{Status: 200, Complete: true})
	want := "[first reads true second reads true first hold second hold decided first-token hook complete hook]"
	if got := fmt.Sprint(log); got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
}

// buildConfig parses and builds a picker config for a test, with every
// registered plugin and the handle h.
func buildConfig(t testing.TB, yaml string, h *scheduling.Handle) *config.Built {
	t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	built, err := config.Build(c, all.Registry(), h, nil)
	if err != nil {
		t.Fatal(err)
	}
	return built
}
