package batch

import (
	"os"
	"path/filepath"
)

// atomicFile is a blob being written: it appears under its id only on
// commit, whole and fsync'd.
type atomicFile struct {
	*os.File
	dst string
	n   int64
}

func (b *Blobs) create(id string) (*atomicFile, error) {
	f, err := os.CreateTemp(b.dir, ".tmp-"+id+"-")
	if err != nil {
		return nil, err
	}
	return &atomicFile{File: f, dst: b.path(id)}, nil
}

func (a *atomicFile) Write(p []byte) (int, error) {
	n, err := a.File.Write(p)
	a.n += int64(n)
	return n, err
}

func (a *atomicFile) commit() error {
	err := a.Sync()
	if cerr := a.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(a.Name(), a.dst)
	}
	if err == nil {
		err = syncDir(filepath.Dir(a.dst))
	}
	if err != nil {
		os.Remove(a.Name())
	}
	return err
}

func (a *atomicFile) abort() {
	a.Close()
	os.Remove(a.Name())
}
