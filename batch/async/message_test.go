package async

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// llm-d-async's documented messages (docs/guides/e2e-deploy.md and the
// README's pub/sub example).
const (
	upstreamRedisMsg = `{"request_kind":"redis","internal":{},"data":{"id":"test-1","created":1700000000,"deadline":1999999999,"payload":{"model":"Qwen/Qwen3-0.6B","prompt":"What is 2+2?"}}}`
	upstreamPlainMsg = `{"request_kind":"plain","data":{"id":"testmsg","created":1764044000,"deadline":9999999999,"payload":{"model":"unsloth/Meta-Llama-3.1-8B","prompt":"hi"}}}`
)

func TestDecodeEnvelope(t *testing.T) {
	for _, tc := range []struct {
		name, in, id, kind, payload string
		deadline                    int64
	}{
		{"upstream redis", upstreamRedisMsg, "test-1", KindRedis, `{"model":"Qwen/Qwen3-0.6B","prompt":"What is 2+2?"}`, 1999999999},
		{"upstream plain", upstreamPlainMsg, "testmsg", KindPlain, `{"model":"unsloth/Meta-Llama-3.1-8B","prompt":"hi"}`, 9999999999},
		{"bare message", `{"id":"b","deadline":5,"payload":{"a":1}}`, "b", KindPlain, `{"a":1}`, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := DecodeEnvelope([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if e.Request.ID != tc.id || e.Kind != tc.kind || e.Request.Deadline != tc.deadline || string(e.Request.Payload) != tc.payload {
				t.Fatalf("got id %q kind %q deadline %d payload %s", e.Request.ID, e.Kind, e.Request.Deadline, e.Request.Payload)
			}
			// A round trip keeps everything.
			b, err := e.Encode()
			if err != nil {
				t.Fatal(err)
			}
			e2, err := DecodeEnvelope(b)
			if err != nil {
				t.Fatal(err)
			}
			if e2.Request.ID != e.Request.ID || e2.Kind != e.Kind || string(e2.Request.Payload) != string(e.Request.Payload) {
				t.Fatalf("round trip changed the message: %s", b)
			}
		})
	}
}

func TestDecodeEnvelopeRoutingAndOverrides(t *testing.T) {
	in := `{"internal":{"retry_count":2,"request_token":"tok","labels":{"tier":"batch"}},"request_kind":"redis",` +
		`"data":{"id":"x","deadline":10,"payload":{},"result_queue_name":"mine","request_queue_name":"q2","metadata":{"userid":"u"}}}`
	e, err := DecodeEnvelope([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if e.Routing.RetryCount != 2 || e.Routing.RequestToken != "tok" || e.Routing.ResultQueueName != "mine" ||
		e.Routing.RequestQueueName != "q2" || e.Routing.Labels["tier"] != "batch" || e.Request.Metadata["userid"] != "u" {
		t.Fatalf("routing %+v request %+v", e.Routing, e.Request)
	}
	var wire map[string]json.RawMessage
	b, _ := e.Encode()
	if err := json.Unmarshal(b, &wire); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"internal", "request_kind", "data"} {
		if _, ok := wire[k]; !ok {
			t.Fatalf("encoded envelope has no %q: %s", k, b)
		}
	}
}

func TestDecodeEnvelopeRefuses(t *testing.T) {
	for _, in := range []string{
		``, `[]`, `{"request_kind":"alien","data":{"id":"x","deadline":1,"payload":{}}}`,
		`{"request_kind":"plain"}`, `{"id":"","deadline":1,"payload":{}}`, `{"id":"x","deadline":0,"payload":{}}`,
		`{"id":"x","deadline":-3,"payload":{}}`, `{"id":"x","deadline":1}`, `{"id":"x","deadline":1,"payload":"text"}`,
		`{"id":"x","deadline":"soon","payload":{}}`,
	} {
		if _, err := DecodeEnvelope([]byte(in)); !errors.Is(err, ErrMessage) {
			t.Errorf("%q: err %v, want ErrMessage", in, err)
		}
	}
}

func TestExpired(t *testing.T) {
	e := &Envelope{Request: Request{Deadline: 100}}
	if e.Expired(time.Unix(100, 900e6)) {
		t.Fatal("expired within its deadline second")
	}
	if !e.Expired(time.Unix(101, 0)) {
		t.Fatal("not expired after its deadline")
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte(upstreamRedisMsg))
	f.Add([]byte(upstreamPlainMsg))
	f.Add([]byte(`{"id":"b","deadline":5,"payload":{"a":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeEnvelope(b)
		if err != nil {
			return
		}
		out, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		e2, err := DecodeEnvelope(out)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", out, err)
		}
		if e2.Request.ID != e.Request.ID || e2.Request.Deadline != e.Request.Deadline {
			t.Fatalf("round trip changed %q/%d to %q/%d", e.Request.ID, e.Request.Deadline, e2.Request.ID, e2.Request.Deadline)
		}
	})
}
