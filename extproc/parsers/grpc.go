package parsers

import (
	"encoding/binary"
	"fmt"

	"github.com/kvgate/kvgate/internal/openai"
)

// GRPCMessage returns the one uncompressed message of a gRPC request body
// (a 5-byte frame header: compressed flag, big-endian length). Errors wrap
// openai.ErrInvalidRequest.
func GRPCMessage(b []byte) ([]byte, error) {
	if len(b) < 5 {
		return nil, fmt.Errorf("%w: %d bytes is no gRPC message", openai.ErrInvalidRequest, len(b))
	}
	if b[0] != 0 {
		return nil, fmt.Errorf("%w: compressed gRPC messages are not parsed", openai.ErrInvalidRequest)
	}
	if n := binary.BigEndian.Uint32(b[1:5]); uint64(n) != uint64(len(b)-5) {
		return nil, fmt.Errorf("%w: gRPC frame of %d bytes holds %d", openai.ErrInvalidRequest, n, len(b)-5)
	}
	return b[5:], nil
}

// GRPCFrame frames msg as one uncompressed gRPC message.
func GRPCFrame(msg []byte) []byte {
	out := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	return append(out, msg...)
}
