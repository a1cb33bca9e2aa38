package server

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// decisionResponse is the request headers response that routes the request:
// the destination header (which replaces any client value), the same value
// as envoy.lb dynamic metadata, and clear_route_cache so that Envoy picks
// the route again with the new header.
func decisionResponse(req *Request, d *Decision, dest string, setID, setLength bool, bodyLen int) *extprocv3.ProcessingResponse {
	set := make([]*corev3.HeaderValueOption, 0, len(d.Headers)+3)
	set = append(set, setHeader(eppwire.HeaderDestination, dest))
	for k, v := range d.Headers {
		set = append(set, setHeader(k, v))
	}
	if setID {
		set = append(set, setHeader(eppwire.HeaderRequestID, req.ID))
	}
	if setLength {
		set = append(set, setHeader("content-length", strconv.Itoa(bodyLen)))
	}
	mutation := &extprocv3.HeaderMutation{SetHeaders: set}
	for _, name := range eppwire.PickerOnlyHeaders() {
		if _, ok := d.Headers[name]; !ok && name != eppwire.HeaderDestination {
			// A client's own value never reaches the decode pod's sidecar.
			mutation.RemoveHeaders = append(mutation.RemoveHeaders, name)
		}
	}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				HeaderMutation:  mutation,
				ClearRouteCache: true,
			},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			eppwire.MetadataLB: {Kind: &structpb.Value_StructValue{StructValue: &structpb.Struct{Fields: map[string]*structpb.Value{
				eppwire.HeaderDestination: {Kind: &structpb.Value_StringValue{StringValue: dest}},
			}}}},
		}},
	}
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// streamedBody is a FULL_DUPLEX_STREAMED body response carrying chunk.
func streamedBody(chunk []byte, eos bool) *extprocv3.BodyResponse {
	return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos},
		}},
	}}
}

// errorResponse answers the client directly with the GIE error body
// "inference error: <code> - <message>".
func errorResponse(e *inferr.Error) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{setHeader("content-type", "text/plain; charset=utf-8")}
	if e.DroppedReason != "" {
		set = append(set, setHeader(eppwire.HeaderDroppedReason, e.DroppedReason))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.HTTPStatus())},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    []byte(e.Error()),
			Details: string(e.Code),
		},
	}}
}
