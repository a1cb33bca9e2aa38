package wasmhost

import (
	"context"
	"strings"

	"github.com/tetratelabs/wazero/api"
)

// LocalResponse is a response the filter sent instead of forwarding the
// request (proxy_send_local_response).
type LocalResponse struct {
	Status  int
	Details string
	Headers [][2]string
	Body    []byte
}

// Stream is one HTTP request inside a VM. Its methods must be called from
// the goroutine that holds the VM.
type Stream struct {
	vm      *VM
	id      uint32
	headers [][2]string
	body    []byte
	props   map[string][]byte
	local   *LocalResponse
	done    bool
}

// NewStream creates an HTTP context for a request with the given headers
// (lower-case names, pseudo-headers such as :path included). The stream
// owns headers from here on.
func (vm *VM) NewStream(ctx context.Context, headers [][2]string) (*Stream, error) {
	s := &Stream{vm: vm, id: vm.nextID, headers: headers}
	vm.nextID++
	if vm.nextID <= vm.rootID {
		// Wrapped after 2^32 streams: 0 is no context and the root's id
		// is taken, so start again above it. A VM runs one stream at a
		// time, so no live stream holds the ids reused.
		vm.nextID = vm.rootID + 1
	}
	if _, err := s.call(ctx, vm.onContextCreate, uint64(s.id), uint64(vm.rootID)); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Stream) call(ctx context.Context, f api.Function, args ...uint64) (uint64, error) {
	s.vm.cur = s
	defer func() { s.vm.cur = nil }()
	return s.vm.call(withVM(ctx, s.vm), f, args...)
}

// OnRequestHeaders runs the filter's request header callback.
func (s *Stream) OnRequestHeaders(ctx context.Context, endOfStream bool) (Action, error) {
	r, err := s.call(ctx, s.vm.onRequestHeaders, uint64(s.id), uint64(len(s.headers)), wasmBool(endOfStream))
	return Action(r), err
}

// OnRequestBody runs the body callback with everything buffered so far:
// body must start with the bytes of every earlier call (the host buffers
// while the filter returns Pause, as Envoy does).
func (s *Stream) OnRequestBody(ctx context.Context, body []byte, endOfStream bool) (Action, error) {
	s.body = body
	r, err := s.call(ctx, s.vm.onRequestBody, uint64(s.id), uint64(len(body)), wasmBool(endOfStream))
	s.body = nil
	return Action(r), err
}

// Headers are the request headers as the filter left them.
func (s *Stream) Headers() [][2]string { return s.headers }

// LocalResponse is the response the filter sent, if any.
func (s *Stream) LocalResponse() *LocalResponse { return s.local }

// Done ends the stream (proxy_on_log, proxy_on_delete). The VM may be
// released afterwards.
func (s *Stream) Done(ctx context.Context) error {
	if s.done {
		return nil
	}
	s.done = true
	if _, err := s.call(ctx, s.vm.onLog, uint64(s.id)); err != nil {
		return err
	}
	_, err := s.call(ctx, s.vm.onDelete, uint64(s.id))
	return err
}

func wasmBool(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// header map operations on the request headers; names compare
// case-insensitively as in Envoy.

func (s *Stream) get(name string) (string, bool) {
	for _, kv := range s.headers {
		if strings.EqualFold(kv[0], name) {
			return kv[1], true
		}
	}
	return "", false
}

func (s *Stream) remove(name string) {
	out := s.headers[:0]
	for _, kv := range s.headers {
		if !strings.EqualFold(kv[0], name) {
			out = append(out, kv)
		}
	}
	s.headers = out
}

// replace sets the first occurrence and drops the rest, adding the header
// if absent (Envoy's setCopy).
func (s *Stream) replace(name, value string) {
	name = strings.ToLower(name)
	out := s.headers[:0]
	found := false
	for _, kv := range s.headers {
		switch {
		case !strings.EqualFold(kv[0], name):
			out = append(out, kv)
		case !found:
			out = append(out, [2]string{name, value})
			found = true
		}
	}
	if !found {
		out = append(out, [2]string{name, value})
	}
	s.headers = out
}

func (s *Stream) add(name, value string) {
	s.headers = append(s.headers, [2]string{strings.ToLower(name), value})
}

func (s *Stream) setProperty(path string, value []byte) bool {
	if s.props == nil {
		s.props = map[string][]byte{}
	}
	if _, ok := s.props[path]; !ok && len(s.props) >= maxPropertyEntries {
		return false
	}
	if len(value) > maxPropertyBytes {
		return false
	}
	s.props[path] = append([]byte(nil), value...)
	return true
}
