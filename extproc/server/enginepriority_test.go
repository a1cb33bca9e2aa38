package server

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
)

// A decision's EnginePriority reaches the model server as the body's
// priority, beside a model rewrite, with content-length following.
func TestEnginePriorityRewritesBody(t *testing.T) {
	p := -100
	d := newTestDirector()
	d.decide = func(r *Request) (*Decision, error) {
		return &Decision{Endpoints: []string{"10.0.0.1:8000"}, TargetModel: r.ModelRewrite, EnginePriority: &p}, nil
	}
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/chat/completions",
		"x-gateway-model-name-rewrite", "llama-lora", "content-length", strconv.Itoa(len(chatBody))))
	e.Send(envoytest.RequestBody([]byte(chatBody), true))
	set := envoytest.SetHeaders(t, e.Recv())
	sr := envoytest.StreamedChunk(t, e.Recv().GetRequestBody())
	var got map[string]any
	if err := json.Unmarshal(sr.GetBody(), &got); err != nil {
		t.Fatal(err)
	}
	if got["model"] != "llama-lora" || got["priority"] != float64(-100) || got["stream"] != true {
		t.Errorf("rewritten body %s", sr.GetBody())
	}
	if set["content-length"] != strconv.Itoa(len(sr.GetBody())) {
		t.Errorf("content-length = %q, body is %d bytes", set["content-length"], len(sr.GetBody()))
	}
}
