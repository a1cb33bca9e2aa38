package nixl

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Region is anonymous memory outside the Go heap (AllocDRAM) that may be
// registered. Bytes views it. (Shared-memory files are mapped by
// agent/kvblock.Map, also outside the Go heap.)
type Region struct {
	buf []byte
}

// AllocDRAM maps size bytes of anonymous, zeroed memory.
func AllocDRAM(size int) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("nixl: allocation size %d must be positive", size)
	}
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("nixl: mmap %d bytes: %w", size, err)
	}
	return &Region{buf: b}, nil
}

// Bytes is the region's memory. It stays valid until Close.
func (r *Region) Bytes() []byte { return r.buf }

// Addr is the region's base address for descriptors.
func (r *Region) Addr() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(r.buf))) }

// Len is the region's size.
func (r *Region) Len() int { return len(r.buf) }

// Desc describes bytes [off, off+n) of the region.
func (r *Region) Desc(off, n int) Desc {
	return Desc{Addr: r.Addr() + uintptr(off), Len: uint64(n)}
}

// Close unmaps the region. Deregister it from every agent first.
func (r *Region) Close() error {
	if r.buf == nil {
		return nil
	}
	err := syscall.Munmap(r.buf)
	r.buf = nil
	return err
}
