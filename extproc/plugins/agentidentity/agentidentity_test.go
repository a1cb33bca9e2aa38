package agentidentity

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/internal/eppwire"
)

func TestRequestHeader(t *testing.T) {
	tests := []struct {
		name, params string
		headers      map[string]string
		want         string
	}{
		{"claude code", "", map[string]string{"x-claude-code-session-id": "s1"}, "s1"},
		{"opencode", "", map[string]string{"x-session-affinity": "oc"}, "oc"},
		{"codex", "", map[string]string{"session-id": "cx"}, "cx"},
		{"codex legacy", "", map[string]string{"session_id": "old"}, "old"},
		{"priority order", "", map[string]string{"session-id": "cx", "x-session-affinity": "oc"}, "oc"},
		{"empty value skipped", "", map[string]string{"x-claude-code-session-id": " ", "session-id": "cx"}, "cx"},
		{"none", "", map[string]string{"x-other": "v"}, "default-flow"},
		{"explicit fairness wins", "", map[string]string{eppwire.HeaderFairnessID: "tenant", "session-id": "cx"}, "default-flow"},
		{"GIE fairness wins", "", map[string]string{eppwire.HeaderFairnessIDDeprecated: "tenant", "session-id": "cx"}, "default-flow"},
		{"additional first", `{"additionalSessionHeaders": ["X-My-Agent"]}`, map[string]string{"x-my-agent": "mine", "session-id": "cx"}, "mine"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var raw []byte
			if tc.params != "" {
				raw = []byte(tc.params)
			}
			p, err := New("", raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			// The director sets the fairness id from the explicit header
			// (here: the default) before the hooks run.
			req := &scheduling.Request{Headers: tc.headers, FairnessID: "default-flow"}
			p.(*Plugin).RequestHeader(context.Background(), req)
			if req.FairnessID != tc.want {
				t.Fatalf("fairness id %q, want %q", req.FairnessID, tc.want)
			}
		})
	}
	for _, bad := range []string{`{"additionalSessionHeaders": [""]}`, `{"sessionHeaders": ["x"]}`} {
		if _, err := New("", []byte(bad), nil); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
