package batch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Blobs keeps file contents as files in one directory. Writes go to a
// temporary name, are fsync'd and renamed, so a reader or a restart sees a
// whole file or none.
type Blobs struct{ dir string }

// errTooLarge is returned when an upload passes its limit.
var errTooLarge = errors.New("file too large")

func newBlobs(dir string) (*Blobs, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("blob dir: %w", err)
	}
	return &Blobs{dir: dir}, nil
}

func (b *Blobs) path(id string) string { return filepath.Join(b.dir, id) }

// Put stores r's content as id; more than limit bytes (if limit > 0) fails
// with errTooLarge and stores nothing.
func (b *Blobs) Put(id string, r io.Reader, limit int64) (int64, error) {
	a, err := b.create(id)
	if err != nil {
		return 0, err
	}
	src := r
	if limit > 0 {
		src = io.LimitReader(r, limit+1)
	}
	n, err := io.Copy(a, src)
	if err == nil && limit > 0 && n > limit {
		err = errTooLarge
	}
	if err != nil {
		a.abort()
		return n, err
	}
	return n, a.commit()
}

// Open opens id's content.
func (b *Blobs) Open(id string) (*os.File, error) {
	f, err := os.Open(b.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	return f, err
}

// Remove deletes id's content; a missing one is not an error.
func (b *Blobs) Remove(id string) error {
	err := os.Remove(b.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
