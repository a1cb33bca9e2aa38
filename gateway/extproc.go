package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/internal/eppwire"
)

// Errors of the ext_proc exchange; both mean the picker failed, and
// FailureModeAllow decides what the client sees.
var (
	errProcessorTimeout = errors.New("ext_proc message timeout")
	errProcessor        = errors.New("ext_proc stream failed")
	// errPickerDone is the picker's clean end of the stream (status OK)
	// with an answer still due: Envoy's onGrpcClose, after which the
	// request goes on without the picker whatever FailureModeAllow says.
	errPickerDone = fmt.Errorf("%w: closed by the picker", errProcessor)
)

// pickerFailed tells the picker's failures (FailureModeAllow rules on
// them) from the client's and the request's own ends.
func pickerFailed(err error) bool {
	return errors.Is(err, errProcessor) || errors.Is(err, errProcessorTimeout)
}

// processor is the ext_proc stream of one request. Sends come from the
// request goroutine and the body pump, serialized by sendMu; recvLoop is
// the only receiver and hands messages over in order through msgs.
type processor struct {
	stream  extprocv3.ExternalProcessor_ProcessClient
	cancel  context.CancelFunc
	timeout time.Duration

	sendMu sync.Mutex
	// closed is set once the gateway ends the stream itself: the end a
	// waiter then sees is no failure of the picker's.
	closed atomic.Bool

	msgs    chan *extprocv3.ProcessingResponse
	recvErr error // written by recvLoop before it closes msgs and ended
	// ended closes when the picker's side of the stream has ended, for a
	// watcher that must not take its messages.
	ended chan struct{}
}

// openProcessor opens the request's stream. Opening waits for a connection
// that is still being made and for stream quota on one that is (a picker
// at its concurrent-stream limit); openTimeout bounds that wait, as it
// bounds each message after.
func openProcessor(ctx context.Context, client extprocv3.ExternalProcessorClient, timeout, openTimeout time.Duration) (*processor, error) {
	sctx, cancel := context.WithCancel(ctx)
	var timedOut atomic.Bool
	t := time.AfterFunc(openTimeout, func() { timedOut.Store(true); cancel() })
	stream, err := client.Process(sctx)
	if !t.Stop() || err != nil {
		cancel()
		if timedOut.Load() {
			return nil, fmt.Errorf("%w: opening the stream", errProcessorTimeout)
		}
		return nil, fmt.Errorf("%w: open: %w", errProcessor, err)
	}
	// msgs is small: the picker answers in step with what is sent, so a
	// few messages in flight suffice and a stalled reader stalls gRPC flow
	// control rather than memory.
	p := &processor{stream: stream, cancel: cancel, timeout: timeout, msgs: make(chan *extprocv3.ProcessingResponse, 8), ended: make(chan struct{})}
	go p.recvLoop(sctx)
	return p, nil
}

func (p *processor) recvLoop(ctx context.Context) {
	defer close(p.ended)
	defer close(p.msgs)
	for {
		m, err := p.stream.Recv()
		if err != nil {
			p.recvErr = err
			return
		}
		select {
		case p.msgs <- m:
		case <-ctx.Done():
			p.recvErr = ctx.Err()
			return
		}
	}
}

func (p *processor) send(req *extprocv3.ProcessingRequest) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if err := p.stream.Send(req); err != nil {
		return fmt.Errorf("%w: send: %w", errProcessor, err)
	}
	return nil
}

// next waits for the picker's next message, at most the message timeout.
func (p *processor) next(ctx context.Context) (*extprocv3.ProcessingResponse, error) {
	t := time.NewTimer(p.timeout)
	defer t.Stop()
	return p.wait(ctx, t.C, nil)
}

// errClosed is wait's answer once the gateway closed the stream.
var errClosed = errors.New("ext_proc stream closed by the gateway")

// errStopped is wait's answer when its stop channel closed first.
var errStopped = errors.New("stopped waiting for the picker")

// nextUntil waits for the picker's next message without a deadline, or
// until stop closes (errStopped). While a response streams from a slow
// upstream no reply is pending, and Envoy's message timeout does not run
// then either.
func (p *processor) nextUntil(ctx context.Context, stop <-chan struct{}) (*extprocv3.ProcessingResponse, error) {
	return p.wait(ctx, nil, stop)
}

func (p *processor) wait(ctx context.Context, timeout <-chan time.Time, stop <-chan struct{}) (*extprocv3.ProcessingResponse, error) {
	select {
	case m, ok := <-p.msgs:
		if !ok {
			if p.closed.Load() {
				return nil, errClosed
			}
			err := p.recvErr
			if err == nil || errors.Is(err, io.EOF) {
				return nil, errPickerDone
			}
			return nil, fmt.Errorf("%w: %w", errProcessor, err)
		}
		return m, nil
	case <-timeout:
		return nil, errProcessorTimeout
	case <-stop:
		return nil, errStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// watchFailure calls fail if the picker's stream fails before stop closes:
// it ends with an error status while the request itself goes on (the
// picker's own clean close, the request's end and its cancellation are no
// failure). It returns once it will not call fail.
func (p *processor) watchFailure(ctx context.Context, stop <-chan struct{}, fail func(error)) {
	select {
	case <-p.ended:
		if !errors.Is(p.recvErr, io.EOF) && ctx.Err() == nil {
			fail(p.recvErr)
		}
	case <-stop:
	}
}

// close ends the stream; the picker sees the half-close, then the cancel
// releases the receiver.
func (p *processor) close() {
	p.closed.Store(true)
	if !p.sendMu.TryLock() {
		// A send is blocked on flow control (the picker stopped reading):
		// only the cancel releases it.
		p.cancel()
		p.sendMu.Lock()
	}
	_ = p.stream.CloseSend()
	p.sendMu.Unlock()
	p.cancel()
}

// destination reads the picker's choice: the header it set, else the
// envoy.lb dynamic metadata.
func destination(hs headerList, md *structpb.Struct) string {
	if v, ok := hs.get(eppwire.HeaderDestination); ok && v != "" {
		return v
	}
	if lb := md.GetFields()[eppwire.MetadataLB].GetStructValue(); lb != nil {
		return lb.GetFields()[eppwire.HeaderDestination].GetStringValue()
	}
	return ""
}

func servedMetadata(endpoint string) map[string]*structpb.Struct {
	return map[string]*structpb.Struct{eppwire.MetadataLB: {Fields: map[string]*structpb.Value{
		eppwire.MetadataServedKey: structpb.NewStringValue(endpoint),
	}}}
}
