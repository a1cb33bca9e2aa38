// Package kvblock is what a model server and its node agent agree on about
// KV block bytes, without cgo: the shared-memory region file both map, and
// the deterministic content the simulator writes for a block hash and
// checks after a transfer (a stand-in for real KV tensors that makes any
// misplaced, stale or torn block detectable).
package kvblock

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Fill writes block hash's content into b: a splitmix64 stream seeded by
// the hash, so every block (and every 8-byte word in it) differs.
func Fill(b []byte, hash uint64) {
	x := hash ^ 0x9e3779b97f4a7c15
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(b[i:], mix(x))
	}
	if i < len(b) {
		var t [8]byte
		x += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(t[:], mix(x))
		copy(b[i:], t[:])
	}
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Check reports where b differs from hash's content: -1 when it matches.
func Check(b []byte, hash uint64) int {
	x := hash ^ 0x9e3779b97f4a7c15
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		if binary.LittleEndian.Uint64(b[i:]) != mix(x) {
			return i
		}
	}
	if i < len(b) {
		var t [8]byte
		x += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(t[:], mix(x))
		for j := i; j < len(b); j++ {
			if b[j] != t[j-i] {
				return j
			}
		}
	}
	return -1
}

// Map maps the region file at path, shared, creating it and growing it to
// size bytes when needed (a tmpfs file is sparse: untouched slots cost no
// memory). Unmap releases it.
func Map(path string, size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("kvblock: region size %d must be positive", size)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kvblock: open region: %w", err)
	}
	defer f.Close()
	return MapFile(f, size)
}

// MapFile is Map of a region file the caller opened (read-write); the
// mapping outlives f.
func MapFile(f *os.File, size int) ([]byte, error) {
	if err := grow(f, size); err != nil {
		return nil, err
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kvblock: mmap %s: %w", f.Name(), err)
	}
	return b, nil
}

// MapOver maps len(b) bytes of the region file f, shared, in place of the
// mapping b (made by Map or MapFile, or blanked): b's addresses stay valid
// throughout and show the file's bytes afterwards.
func MapOver(f *os.File, b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("kvblock: mapping over an empty range")
	}
	if err := grow(f, len(b)); err != nil {
		return err
	}
	_, err := unix.MmapPtr(int(f.Fd()), 0, unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return fmt.Errorf("kvblock: mmap %s in place: %w", f.Name(), err)
	}
	return nil
}

// grow makes f at least size bytes long.
func grow(f *os.File, size int) error {
	if size <= 0 {
		return fmt.Errorf("kvblock: region size %d must be positive", size)
	}
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("kvblock: stat region: %w", err)
	}
	if st.Size() < int64(size) {
		if err := f.Truncate(int64(size)); err != nil {
			return fmt.Errorf("kvblock: size region %s to %d bytes: %w", f.Name(), size, err)
		}
	}
	return nil
}

// Blank replaces a mapping made by Map, in place, by private zero pages: the
// addresses stay valid (for readers that may still use them) while the
// file's pages are released.
func Blank(b []byte) error {
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_FIXED)
	if err != nil {
		return fmt.Errorf("kvblock: blank region: %w", err)
	}
	return nil
}

// Unmap releases a mapping made by Map.
func Unmap(b []byte) error { return syscall.Munmap(b) }

// ContentHash is the hash whose content b starts with (any 8 or more
// bytes; b need not be that block's: a failed check uses it to name the
// block a slot holds instead). mix is a bijection, so its first word
// gives the seed back.
func ContentHash(b []byte) uint64 {
	if len(b) < 8 {
		return 0
	}
	z := binary.LittleEndian.Uint64(b)
	z ^= z>>31 ^ z>>62
	z *= 0x319642b2d24d8ec3
	z ^= z>>27 ^ z>>54
	z *= 0x96de1b173f119089
	z ^= z>>30 ^ z>>60
	return (z - 0x9e3779b97f4a7c15) ^ 0x9e3779b97f4a7c15
}
