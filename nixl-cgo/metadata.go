package nixl

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Agent metadata, as getLocalMD exports it and loadRemoteMD reads it. The
// blob is kvgate's own (NIXL's serializer format is not specified outside
// its code); it carries what a peer needs to reach this agent over UCX:
//
//	magic "KVGNIXL" version(1)
//	name            u16 length + bytes
//	backends        u8 count, each:
//	  type          u16 length + bytes ("UCX")
//	  workers       u16 count, each u32 length + UCP worker address
//	  regions       u32 count, each:
//	    mem type u8, addr u64, len u64, dev id u64, u32 length + packed rkey
//	crc32c of all the above, u32
//
// All integers little-endian. The checksum makes a corrupted blob an error
// here instead of a garbage worker address handed to UCP.

const (
	mdMagic      = "KVGNIXL"
	mdVersion    = 1
	maxNameLen   = 256
	maxWorkers   = 64
	maxRegions   = 1 << 20
	maxBlobField = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type regionMD struct {
	Type MemType
	Desc Desc
	RKey []byte
}

type backendMD struct {
	Type    string
	Workers [][]byte
	Regions []regionMD
}

type agentMD struct {
	Name     string
	Backends []backendMD
}

func (m *agentMD) encode() []byte {
	b := append([]byte(mdMagic), mdVersion)
	b = appendStr16(b, m.Name)
	b = append(b, byte(len(m.Backends)))
	for _, be := range m.Backends {
		b = appendStr16(b, be.Type)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(be.Workers)))
		for _, w := range be.Workers {
			b = appendBlob32(b, w)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(be.Regions)))
		for _, r := range be.Regions {
			b = append(b, byte(r.Type))
			b = binary.LittleEndian.AppendUint64(b, uint64(r.Desc.Addr))
			b = binary.LittleEndian.AppendUint64(b, r.Desc.Len)
			b = binary.LittleEndian.AppendUint64(b, r.Desc.DevID)
			b = appendBlob32(b, r.RKey)
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func appendStr16(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func appendBlob32(b, v []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// mdReader reads the blob; the first error sticks and later reads return
// zero values.
type mdReader struct {
	b   []byte
	err error
}

func (r *mdReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *mdReader) next(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.fail("truncated at %s (want %d bytes, %d left)", what, n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *mdReader) u8(what string) int {
	if v := r.next(1, what); v != nil {
		return int(v[0])
	}
	return 0
}

func (r *mdReader) u16(what string) int {
	if v := r.next(2, what); v != nil {
		return int(binary.LittleEndian.Uint16(v))
	}
	return 0
}

func (r *mdReader) u32(what string) int {
	if v := r.next(4, what); v != nil {
		return int(binary.LittleEndian.Uint32(v))
	}
	return 0
}

func (r *mdReader) u64(what string) uint64 {
	if v := r.next(8, what); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *mdReader) blob(what string, max int) []byte {
	n := r.u32(what + " length")
	if n > max {
		r.fail("%s of %d bytes exceeds %d", what, n, max)
		return nil
	}
	return r.next(n, what)
}

// decodeMD parses and validates a metadata blob.
func decodeMD(blob []byte) (*agentMD, error) {
	const head = len(mdMagic) + 1
	if len(blob) < head+4 {
		return nil, fmt.Errorf("metadata of %d bytes is too short", len(blob))
	}
	if string(blob[:len(mdMagic)]) != mdMagic {
		return nil, fmt.Errorf("not kvgate NIXL metadata (bad magic)")
	}
	if v := blob[len(mdMagic)]; v != mdVersion {
		return nil, fmt.Errorf("metadata version %d, this build reads %d", v, mdVersion)
	}
	body, sum := blob[:len(blob)-4], binary.LittleEndian.Uint32(blob[len(blob)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("metadata checksum mismatch (corrupted)")
	}
	r := &mdReader{b: body[head:]}
	m := &agentMD{}
	n := r.u16("name length")
	if n == 0 || n > maxNameLen {
		r.fail("agent name length %d out of range 1..%d", n, maxNameLen)
	}
	m.Name = string(r.next(n, "name"))
	nb := r.u8("backend count")
	for i := 0; i < nb && r.err == nil; i++ {
		var be backendMD
		be.Type = string(r.next(r.u16("backend type length"), "backend type"))
		nw := r.u16("worker count")
		if nw == 0 || nw > maxWorkers {
			r.fail("backend %q: %d workers, want 1..%d", be.Type, nw, maxWorkers)
		}
		for j := 0; j < nw && r.err == nil; j++ {
			// UCP reads an address without a length: an empty one would
			// have it parse what lies past the buffer.
			if w := r.blob("worker address", maxBlobField); r.err == nil && len(w) == 0 {
				r.fail("backend %q: worker address %d is empty", be.Type, j)
			} else {
				be.Workers = append(be.Workers, w)
			}
		}
		nr := r.u32("region count")
		if nr > maxRegions {
			r.fail("%d regions exceed %d", nr, maxRegions)
		}
		for j := 0; j < nr && r.err == nil; j++ {
			var rg regionMD
			rg.Type = MemType(r.u8("mem type"))
			rg.Desc = Desc{Addr: uintptr(r.u64("addr")), Len: r.u64("len"), DevID: r.u64("dev id")}
			rg.RKey = r.blob("rkey", maxBlobField)
			if r.err == nil && (rg.Desc.Len == 0 || rg.Desc.end() < uint64(rg.Desc.Addr)) {
				r.fail("region %d: bad extent addr=%#x len=%d", j, rg.Desc.Addr, rg.Desc.Len)
			}
			be.Regions = append(be.Regions, rg)
		}
		m.Backends = append(m.Backends, be)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return nil, r.err
	}
	return m, nil
}
