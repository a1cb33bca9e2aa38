package director

import (
	"errors"

	"github.com/kvgate/kvgate/extproc/flowcontrol"
	"github.com/kvgate/kvgate/extproc/inferr"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/server"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// FlowRequest is what flow control knows of a request. Its size is the
// body's, or the content-length a headers-only request announces: the
// proxy holds that body while the request waits, and maxBytes bounds it
// alike.
func FlowRequest(req *server.Request, sr *scheduling.Request) flowcontrol.Request {
	fr := flowcontrol.Request{
		ID: req.ID, FairnessID: sr.FairnessID, Priority: sr.Priority,
		Model: sr.IncomingModel, TargetModel: sr.TargetModel,
		Bytes: int64(max(0, requestSize(req))), ReceivedAt: req.ReceivedAt, TTFTSLO: sr.TTFTSLO,
	}
	if fr.FairnessID == "" {
		fr.FairnessID = server.DefaultFairnessID
	}
	return fr
}

// FlowError is a flow-control refusal as the client sees it, mapped as
// llm-d's router maps its outcomes: a full queue or a TTL that ran out
// while the pool had endpoints is backpressure (429); no endpoints, a
// cancelled client and a stopping picker are unavailability (503).
func FlowError(err error) *inferr.Error {
	var fe *flowcontrol.Error
	if !errors.As(err, &fe) {
		return inferr.As(err)
	}
	exhausted := func(reason string) *inferr.Error {
		return &inferr.Error{Code: inferr.ResourceExhausted, Msg: fe.Error(), DroppedReason: reason}
	}
	unavailable := func(reason string) *inferr.Error {
		return &inferr.Error{Code: inferr.ServiceUnavailable, Msg: fe.Error(), DroppedReason: reason}
	}
	switch {
	case fe.ShuttingDown:
		return unavailable(eppwire.DroppedShuttingDown)
	case fe.Outcome == flowcontrol.RejectedCapacity:
		return exhausted(eppwire.DroppedSaturated)
	case fe.Outcome == flowcontrol.RejectedNoEndpoints, fe.Outcome == flowcontrol.EvictedNoEndpoints,
		fe.Outcome == flowcontrol.EvictedTTL && fe.PoolEmpty:
		return unavailable(eppwire.DroppedNoEndpoints)
	case fe.Outcome == flowcontrol.EvictedTTL:
		return exhausted(eppwire.DroppedTTLExpired)
	case fe.Outcome == flowcontrol.EvictedContextCancelled:
		return unavailable(eppwire.DroppedContextCancelled)
	default:
		return &inferr.Error{Code: inferr.Internal, Msg: fe.Error()}
	}
}
