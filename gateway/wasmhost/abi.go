package wasmhost

import "encoding/binary"

// ABI constants (proxy-wasm spec, ABI 0.2.1), the subset the host speaks.
type status uint32

const (
	statusOK          status = 0
	statusNotFound    status = 1
	statusBadArgument status = 2
	statusInternal    status = 10
)

const (
	mapRequestHeaders  = 0
	mapRequestTrailers = 1
)

const (
	bufferRequestBody   = 0
	bufferVMConfig      = 6
	bufferPluginConfig  = 7
	maxPropertyEntries  = 64
	maxPropertyBytes    = 64 << 10
	maxLocalResponseLen = 1 << 20
)

// Action is a filter callback's verdict.
type Action uint32

const (
	// Continue passes the headers or body on.
	Continue Action = 0
	// Pause holds them: for headers until the body is seen, for body
	// chunks the host buffers and calls again with the total size.
	Pause Action = 1
)

// encodePairs serializes a header map the way the ABI does: count, then
// (key length, value length) pairs, then each key and value NUL-terminated,
// all little endian.
func encodePairs(pairs [][2]string) []byte {
	size := 4
	for _, kv := range pairs {
		size += 8 + len(kv[0]) + len(kv[1]) + 2
	}
	b := make([]byte, 4+8*len(pairs), size)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	for i, kv := range pairs {
		binary.LittleEndian.PutUint32(b[4+8*i:], uint32(len(kv[0])))
		binary.LittleEndian.PutUint32(b[8+8*i:], uint32(len(kv[1])))
	}
	for _, kv := range pairs {
		b = append(b, kv[0]...)
		b = append(b, 0)
		b = append(b, kv[1]...)
		b = append(b, 0)
	}
	return b
}

// decodePairs is the inverse of encodePairs; ok is false for anything
// that does not parse exactly (guest memory is untrusted input).
func decodePairs(b []byte) (pairs [][2]string, ok bool) {
	if len(b) < 4 {
		return nil, false
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n > (len(b)-4)/10 {
		return nil, false
	}
	data := 4 + 8*n
	pairs = make([][2]string, n)
	for i := 0; i < n; i++ {
		kl := int(binary.LittleEndian.Uint32(b[4+8*i:]))
		vl := int(binary.LittleEndian.Uint32(b[8+8*i:]))
		if kl > len(b)-data || vl > len(b)-data-kl-1 || data+kl+vl+2 > len(b) {
			return nil, false
		}
		k := string(b[data : data+kl])
		data += kl + 1
		v := string(b[data : data+vl])
		data += vl + 1
		pairs[i] = [2]string{k, v}
	}
	return pairs, data == len(b)
}
