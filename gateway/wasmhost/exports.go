package wasmhost

import (
	"context"
	"log/slog"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// exportABI instantiates the "env" host module with the ABI functions
// this host implements and returns their names.
func exportABI(ctx context.Context, r wazero.Runtime) (map[string]bool, error) {
	fns := map[string]any{
		"proxy_log":                      proxyLog,
		"proxy_get_header_map_value":     proxyGetHeaderMapValue,
		"proxy_replace_header_map_value": proxyReplaceHeaderMapValue,
		"proxy_remove_header_map_value":  proxyRemoveHeaderMapValue,
		"proxy_add_header_map_value":     proxyAddHeaderMapValue,
		"proxy_get_header_map_pairs":     proxyGetHeaderMapPairs,
		"proxy_set_header_map_pairs":     proxySetHeaderMapPairs,
		"proxy_get_buffer_bytes":         proxyGetBufferBytes,
		"proxy_set_effective_context":    proxySetEffectiveContext,
		"proxy_send_local_response":      proxySendLocalResponse,
		"proxy_get_property":             proxyGetProperty,
		"proxy_set_property":             proxySetProperty,
	}
	b := r.NewHostModuleBuilder("env")
	names := make(map[string]bool, len(fns))
	for name, fn := range fns {
		b.NewFunctionBuilder().WithFunc(fn).Export(name)
		names[name] = true
	}
	_, err := b.Instantiate(ctx)
	return names, err
}

// read copies size bytes of guest memory at ptr.
func read(mod api.Module, ptr, size uint32) ([]byte, bool) {
	b, ok := mod.Memory().Read(ptr, size)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func readString(mod api.Module, ptr, size uint32) (string, bool) {
	b, ok := mod.Memory().Read(ptr, size)
	return string(b), ok
}

// writeOut hands data to the guest the ABI way: memory from the guest's
// own allocator, its address and size stored at ptrPtr and sizePtr.
func writeOut(ctx context.Context, mod api.Module, data []byte, ptrPtr, sizePtr uint32) status {
	var addr uint32
	if len(data) > 0 {
		vm := vmFrom(ctx)
		if vm == nil {
			return statusBadArgument
		}
		res, err := vm.alloc.Call(ctx, uint64(len(data)))
		if err != nil || len(res) == 0 {
			return statusInternal
		}
		addr = uint32(res[0])
		if !mod.Memory().Write(addr, data) {
			return statusInternal
		}
	}
	if !mod.Memory().WriteUint32Le(ptrPtr, addr) || !mod.Memory().WriteUint32Le(sizePtr, uint32(len(data))) {
		return statusBadArgument
	}
	return statusOK
}

// requestHeaders resolves a map type to the current stream; trailers are
// an empty map (the gateway does not run the filter on trailers).
func requestHeaders(ctx context.Context, mapType uint32) (*Stream, status) {
	vm := vmFrom(ctx)
	if vm == nil || vm.cur == nil {
		return nil, statusBadArgument
	}
	switch mapType {
	case mapRequestHeaders:
		return vm.cur, statusOK
	case mapRequestTrailers:
		return nil, statusNotFound
	}
	return nil, statusBadArgument
}

func proxyLog(ctx context.Context, mod api.Module, level, ptr, size uint32) uint32 {
	msg, ok := readString(mod, ptr, size)
	if !ok {
		return uint32(statusBadArgument)
	}
	lvl := slog.LevelError
	switch level {
	case 0, 1:
		lvl = slog.LevelDebug
	case 2:
		lvl = slog.LevelInfo
	case 3:
		lvl = slog.LevelWarn
	}
	log := slog.Default()
	if vm := vmFrom(ctx); vm != nil {
		log = vm.host.log
	}
	log.Log(ctx, lvl, msg, "source", "wasm")
	return uint32(statusOK)
}

func proxyGetHeaderMapValue(ctx context.Context, mod api.Module, mapType, kp, ks, retPtr, retSize uint32) uint32 {
	s, st := requestHeaders(ctx, mapType)
	if st != statusOK {
		return uint32(st)
	}
	name, ok := readString(mod, kp, ks)
	if !ok {
		return uint32(statusBadArgument)
	}
	v, found := s.get(name)
	if !found {
		return uint32(statusNotFound)
	}
	return uint32(writeOut(ctx, mod, []byte(v), retPtr, retSize))
}

func proxyReplaceHeaderMapValue(ctx context.Context, mod api.Module, mapType, kp, ks, vp, vs uint32) uint32 {
	return editHeader(ctx, mod, mapType, kp, ks, vp, vs, (*Stream).replace)
}

func proxyAddHeaderMapValue(ctx context.Context, mod api.Module, mapType, kp, ks, vp, vs uint32) uint32 {
	return editHeader(ctx, mod, mapType, kp, ks, vp, vs, (*Stream).add)
}

func editHeader(ctx context.Context, mod api.Module, mapType, kp, ks, vp, vs uint32, edit func(*Stream, string, string)) uint32 {
	s, st := requestHeaders(ctx, mapType)
	if st != statusOK {
		return uint32(st)
	}
	name, ok1 := readString(mod, kp, ks)
	value, ok2 := readString(mod, vp, vs)
	if !ok1 || !ok2 {
		return uint32(statusBadArgument)
	}
	edit(s, name, value)
	return uint32(statusOK)
}

func proxyRemoveHeaderMapValue(ctx context.Context, mod api.Module, mapType, kp, ks uint32) uint32 {
	s, st := requestHeaders(ctx, mapType)
	if st != statusOK {
		return uint32(st)
	}
	name, ok := readString(mod, kp, ks)
	if !ok {
		return uint32(statusBadArgument)
	}
	s.remove(name)
	return uint32(statusOK)
}

func proxyGetHeaderMapPairs(ctx context.Context, mod api.Module, mapType, retPtr, retSize uint32) uint32 {
	s, st := requestHeaders(ctx, mapType)
	switch {
	case st == statusNotFound:
		return uint32(writeOut(ctx, mod, encodePairs(nil), retPtr, retSize))
	case st != statusOK:
		return uint32(st)
	}
	return uint32(writeOut(ctx, mod, encodePairs(s.headers), retPtr, retSize))
}

func proxySetHeaderMapPairs(ctx context.Context, mod api.Module, mapType, ptr, size uint32) uint32 {
	s, st := requestHeaders(ctx, mapType)
	if st != statusOK {
		return uint32(st)
	}
	b, ok := read(mod, ptr, size)
	if !ok {
		return uint32(statusBadArgument)
	}
	pairs, ok := decodePairs(b)
	if !ok {
		return uint32(statusBadArgument)
	}
	s.headers = pairs
	return uint32(statusOK)
}

func proxyGetBufferBytes(ctx context.Context, mod api.Module, bufType, start, maxSize, retPtr, retSize uint32) uint32 {
	vm := vmFrom(ctx)
	if vm == nil {
		return uint32(statusBadArgument)
	}
	var buf []byte
	switch bufType {
	case bufferRequestBody:
		if vm.cur == nil {
			return uint32(statusBadArgument)
		}
		buf = vm.cur.body
	case bufferVMConfig:
		buf = vm.host.cfg.VMConfig
	case bufferPluginConfig:
		buf = vm.host.cfg.PluginConfig
	default:
		return uint32(statusBadArgument)
	}
	if len(buf) == 0 {
		return uint32(statusNotFound)
	}
	if int(start) >= len(buf) {
		return uint32(statusBadArgument)
	}
	end := len(buf)
	if uint64(start)+uint64(maxSize) < uint64(end) {
		end = int(start + maxSize)
	}
	return uint32(writeOut(ctx, mod, buf[start:end], retPtr, retSize))
}

// proxySetEffectiveContext accepts the current stream or the root context:
// the host runs callbacks synchronously, so there is nothing to switch.
func proxySetEffectiveContext(ctx context.Context, id uint32) uint32 {
	vm := vmFrom(ctx)
	if vm == nil || (id != vm.rootID && (vm.cur == nil || vm.cur.id != id)) {
		return uint32(statusBadArgument)
	}
	return uint32(statusOK)
}

func proxySendLocalResponse(ctx context.Context, mod api.Module, code, dp, ds, bp, bs, hp, hs, _ uint32) uint32 {
	vm := vmFrom(ctx)
	if vm == nil || vm.cur == nil {
		return uint32(statusBadArgument)
	}
	if code < 200 || code > 599 || bs > maxLocalResponseLen {
		return uint32(statusBadArgument)
	}
	details, ok1 := readString(mod, dp, ds)
	body, ok2 := read(mod, bp, bs)
	if !ok1 || !ok2 {
		return uint32(statusBadArgument)
	}
	var headers [][2]string
	if hs > 0 {
		b, ok := read(mod, hp, hs)
		if !ok {
			return uint32(statusBadArgument)
		}
		if headers, ok = decodePairs(b); !ok {
			return uint32(statusBadArgument)
		}
	}
	vm.cur.local = &LocalResponse{Status: int(code), Details: details, Headers: headers, Body: body}
	return uint32(statusOK)
}

// Properties are per stream: a filter's set_property is visible to its own
// get_property on the same request, nothing else.
func proxyGetProperty(ctx context.Context, mod api.Module, pp, ps, retPtr, retSize uint32) uint32 {
	vm := vmFrom(ctx)
	if vm == nil || vm.cur == nil {
		return uint32(statusNotFound)
	}
	path, ok := readString(mod, pp, ps)
	if !ok {
		return uint32(statusBadArgument)
	}
	v, found := vm.cur.props[path]
	if !found {
		return uint32(statusNotFound)
	}
	return uint32(writeOut(ctx, mod, v, retPtr, retSize))
}

func proxySetProperty(ctx context.Context, mod api.Module, pp, ps, vp, vs uint32) uint32 {
	vm := vmFrom(ctx)
	if vm == nil || vm.cur == nil {
		return uint32(statusBadArgument)
	}
	path, ok1 := readString(mod, pp, ps)
	value, ok2 := read(mod, vp, vs)
	if !ok1 || !ok2 {
		return uint32(statusBadArgument)
	}
	if !vm.cur.setProperty(path, value) {
		return uint32(statusBadArgument)
	}
	return uint32(statusOK)
}
