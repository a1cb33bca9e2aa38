package gateway_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// testPicker is a small ext_proc server playing the picker's part of the
// protocol: it routes every request to endpoints (or answers immediately
// with status), echoes bodies back in streamed responses and records what
// it saw.
type testPicker struct {
	extprocv3.UnimplementedExternalProcessorServer
	endpoints string
	immediate int // when non-zero, answer request headers with this status
	// decideOnHeaders decides on the request headers even when a body
	// follows (the body is then echoed at its end, or ignored after an
	// immediate response).
	decideOnHeaders bool
	// stall never answers.
	stall bool
	// lateEOS re-sends the request body without end of stream and ends it
	// with an empty chunk this much later, as a picker may: the upstream
	// can answer before the body's end reaches the gateway.
	lateEOS time.Duration

	// seen gets each request when its stream ends; buffered so that the
	// picker never waits for a test that does not look.
	seen chan pickerSaw
	// opened, when set, gets a value as each stream starts (never
	// blocking the picker).
	opened chan struct{}
}

// pickerSaw is one request as the picker saw it.
type pickerSaw struct {
	headers  map[string]string
	mode     extprocfilterv3.ProcessingMode_BodySendMode
	body     []byte
	served   string
	respBody []byte
}

func startPicker(t testing.TB, p *testPicker) string {
	t.Helper()
	// One channel for the picker's life: a test may serve several gateways
	// from one picker, and an earlier one's stream can still be ending.
	if p.seen == nil {
		p.seen = make(chan pickerSaw, 64)
	}
	return serveProcessor(t, p)
}

// serveProcessor serves an ext_proc server on loopback, with the health
// service on the same port as kvgate's picker has it, and returns its
// address.
func serveProcessor(t testing.TB, p extprocv3.ExternalProcessorServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(s, p)
	// As kvgate's picker: the health service on the ext_proc port.
	hs := health.NewServer()
	hs.SetServingStatus("envoy.service.ext_proc.v3.ExternalProcessor", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// next returns the next request the picker finished with.
func (p *testPicker) next(t testing.TB) pickerSaw {
	t.Helper()
	select {
	case s := <-p.seen:
		return s
	case <-time.After(10 * time.Second): // a hang guard, not a timing assertion
		t.Fatal("picker saw no request")
		return pickerSaw{}
	}
}

func headerMap(m *corev3.HeaderMap) map[string]string {
	out := map[string]string{}
	for _, h := range m.GetHeaders() {
		out[h.GetKey()] = string(h.GetRawValue())
	}
	return out
}

func (p *testPicker) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	select {
	case p.opened <- struct{}{}:
	default:
	}
	var saw pickerSaw
	defer func() {
		select {
		case p.seen <- saw:
		default:
		}
	}()
	decide := func() error {
		if p.immediate != 0 {
			return stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
				ImmediateResponse: &extprocv3.ImmediateResponse{
					Status: &typev3.HttpStatus{Code: typev3.StatusCode(p.immediate)},
					Body:   []byte("inference error: 429 - saturated"),
				},
			}})
		}
		md, _ := structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{"x-gateway-destination-endpoint": p.endpoints}})
		return stream.Send(&extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{
					ClearRouteCache: true,
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
						Header:       &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(p.endpoints)},
						AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
					}}},
				},
			}},
			DynamicMetadata: md,
		})
	}
	streamed := func(b []byte, eos bool) *extprocv3.CommonResponse {
		return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: eos},
		}}}
	}
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if p.stall {
				continue
			}
			saw.headers = headerMap(r.RequestHeaders.GetHeaders())
			saw.mode = req.GetProtocolConfig().GetRequestBodyMode()
			if r.RequestHeaders.GetEndOfStream() || saw.mode == extprocfilterv3.ProcessingMode_NONE || p.decideOnHeaders {
				if err := decide(); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			// Like GIE: buffer to end of stream, decide, then send the
			// body back.
			saw.body = append(saw.body, r.RequestBody.GetBody()...)
			if !r.RequestBody.GetEndOfStream() || p.stall {
				continue
			}
			if !p.decideOnHeaders {
				if err := decide(); err != nil {
					return err
				}
			}
			if p.immediate != 0 {
				return nil
			}
			if p.lateEOS > 0 {
				if err := stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
					RequestBody: &extprocv3.BodyResponse{Response: streamed(saw.body, false)},
				}}); err != nil {
					return err
				}
				time.Sleep(p.lateEOS)
			}
			if err := stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: streamed(saw.body[:len(saw.body)*boolInt(p.lateEOS == 0)], true)},
			}}); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			saw.served = req.GetMetadataContext().GetFilterMetadata()["envoy.lb"].GetFields()["x-gateway-destination-endpoint-served"].GetStringValue()
			if err := stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
						Header: &corev3.HeaderValue{Key: "x-picker-saw-response", RawValue: []byte("true")},
					}}},
				}},
			}}); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			// Chunks go straight back: the picker must never hold up a
			// stream.
			saw.respBody = append(saw.respBody, r.ResponseBody.GetBody()...)
			if err := stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
				ResponseBody: &extprocv3.BodyResponse{Response: streamed(r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream())},
			}}); err != nil {
				return err
			}
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
