package director

import (
	"context"
	"fmt"
	"testing"

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
	c, err := config.Parse([]byte("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: agent-identity\n- type: random-picker\n"))
	if err != nil {
		t.Fatal(err)
	}
	built, err := config.Build(c, all.Registry(), &scheduling.Handle{}, nil)
	if err != nil {
		t.Fatal(err)
	}
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
