package server

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/openai"
)

// hookDirector's exchanges set a response header and report the usage as
// dynamic metadata.
type hookDirector struct{ *testDirector }

type hookExchange struct{ testExchange }

func (d hookDirector) HandleRequest(ctx context.Context, req *Request) (*Decision, Exchange, error) {
	dec, _, err := d.testDirector.HandleRequest(ctx, req)
	return dec, hookExchange{testExchange{d.testDirector}}, err
}

func (hookExchange) ResponseHeaders(_ context.Context, head ResponseHead) map[string]string {
	return map[string]string{"x-served": head.ServedEndpoint, "x-status": "seen"}
}

func (hookExchange) ResponseMetadata(_ context.Context, u openai.Usage, found bool) map[string]map[string]any {
	if !found {
		return map[string]map[string]any{"test": {"usage": false}}
	}
	return map[string]map[string]any{"envoy.lb": {"cost": float64(u.CompletionTokens)}}
}

// The response hooks' headers go on the response headers; their metadata
// on the response's last message, whichever it is: the last body chunk,
// the trailers, or headers that end the response.
func TestResponseHooks(t *testing.T) {
	const usage = `{"usage":{"prompt_tokens":3,"completion_tokens":4}}`
	for _, end := range []string{"body", "trailers", "headers"} {
		t.Run(end, func(t *testing.T) {
			d := hookDirector{newTestDirector("10.0.0.1:8000")}
			e := envoytest.Open(t, startServer(t, New(d, Options{})))
			e.Send(envoytest.RequestHeaders(true, ":method", "GET", ":path", "/v1/models"))
			e.Recv()
			e.Send(envoytest.ResponseHeaders(end == "headers", ":status", "200", "content-type", "application/json"))
			hr := e.Recv()
			got := map[string]string{}
			for _, h := range hr.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
				got[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
			}
			if got["x-status"] != "seen" {
				t.Fatalf("response headers set %v", got)
			}
			last := hr
			switch end {
			case "body":
				if md := hr.GetDynamicMetadata(); md != nil {
					t.Fatalf("metadata on the headers: %v", md)
				}
				e.Send(envoytest.ResponseBody([]byte(usage), true))
				last = e.Recv()
			case "trailers":
				e.Send(envoytest.ResponseBody([]byte(usage), false))
				if md := e.Recv().GetDynamicMetadata(); md != nil {
					t.Fatalf("metadata before the end: %v", md)
				}
				e.Send(envoytest.ResponseTrailers())
				last = e.Recv()
			}
			fields := last.GetDynamicMetadata().GetFields()
			if end == "headers" {
				if v, ok := fields["test"].GetStructValue().GetFields()["usage"]; !ok || v.GetBoolValue() {
					t.Fatalf("metadata %v, want test.usage false", last.GetDynamicMetadata())
				}
				return
			}
			if fields["envoy.lb"].GetStructValue().GetFields()["cost"].GetNumberValue() != 4 {
				t.Fatalf("metadata %v, want envoy.lb cost 4", last.GetDynamicMetadata())
			}
		})
	}
}
