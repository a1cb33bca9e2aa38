package nixl

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// Region is memory outside the Go heap that may be registered: anonymous
// (AllocDRAM) or a shared file mapping (MapShared). Bytes views it.
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

// MapShared maps the file at path (created and sized when it does not
// exist or is shorter) shared, so other processes mapping it see the same
// bytes: the model server / agent memory region in /dev/shm.
func MapShared(path string, size int) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("nixl: mapping size %d must be positive", size)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("nixl: open shared region: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("nixl: stat shared region: %w", err)
	}
	if st.Size() < int64(size) {
		if err := f.Truncate(int64(size)); err != nil {
			return nil, fmt.Errorf("nixl: size shared region %s to %d: %w", path, size, err)
		}
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("nixl: mmap %s: %w", path, err)
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
