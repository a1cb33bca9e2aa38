package server

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"weak"

	"github.com/kvgate/kvgate/extproc/server/envoytest"
	"github.com/kvgate/kvgate/internal/openai"
)

// weakDirector routes every request to one endpoint and keeps only weak
// pointers to its body and parsed view: what keeps them alive is the
// server.
type weakDirector struct {
	seen chan seenBody
}

type seenBody struct {
	body   weak.Pointer[byte]
	parsed weak.Pointer[openai.Request]
}

func (d weakDirector) HandleRequest(_ context.Context, req *Request) (*Decision, Exchange, error) {
	d.seen <- seenBody{weak.Make(&req.Body[0]), weak.Make(req.Parsed)}
	return &Decision{Endpoints: []string{"10.0.0.1:8000"}}, nopExchange{}, nil
}

type nopExchange struct{}

func (nopExchange) ResponseStarted(context.Context, ResponseHead) {}
func (nopExchange) ResponseChunk(context.Context, []byte)         {}
func (nopExchange) ResponseDone(context.Context, ResponseSummary) {}

// TestBodyUnreachableWhileResponseStreams: once the server has sent the
// body back and returned its budget share, neither the body nor its parsed
// view is reachable from the stream, however long the response streams.
func TestBodyUnreachableWhileResponseStreams(t *testing.T) {
	d := weakDirector{seen: make(chan seenBody, 1)}
	e := envoytest.Open(t, startServer(t, New(d, Options{})))
	body := []byte(`{"model":"m","stream":true,"prompt":"` + strings.Repeat("lorem ipsum ", 1<<20/12) + `"}`)
	e.Send(envoytest.RequestHeaders(false, ":method", "POST", ":path", "/v1/completions", "content-length", strconv.Itoa(len(body))))
	const frame = 64 << 10
	for i := 0; i < len(body); i += frame {
		e.Send(envoytest.RequestBody(body[i:min(i+frame, len(body))], i+frame >= len(body)))
	}
	if e.Recv().GetRequestHeaders() == nil {
		t.Fatal("want the routing decision")
	}
	for {
		if envoytest.StreamedChunk(t, e.Recv().GetRequestBody()).GetEndOfStream() {
			break
		}
	}
	// The stream handles one message at a time: once the response's headers
	// are answered, the decision is behind it.
	e.Send(envoytest.ResponseHeaders(false, ":status", "200", "content-type", "text/event-stream"))
	if e.Recv().GetResponseHeaders() == nil {
		t.Fatal("want a response headers response")
	}
	e.Send(envoytest.ResponseBody([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"), false))
	e.Recv()
	seen := <-d.seen
	runtime.GC()
	if seen.body.Value() != nil {
		t.Error("the request body is reachable while the response streams")
	}
	if seen.parsed.Value() != nil {
		t.Error("the parsed request is reachable while the response streams")
	}
	e.Send(envoytest.ResponseBody([]byte("data: [DONE]\n\n"), true))
	e.Recv()
}
