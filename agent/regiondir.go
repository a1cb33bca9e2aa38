package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// DefaultRegionDir is where the model servers and the agent share their
// region files: the node's shared-memory directory (the Helm chart mounts
// it there, agent.regionDir).
const DefaultRegionDir = "/dev/shm"

// What a refused region path wraps (RegionPathError.Err).
var (
	// ErrOutsideRegionDir: the path, or a symlink on it, leads out of the
	// region directory.
	ErrOutsideRegionDir = errors.New("outside the region directory")
	// ErrNotRegularFile: the path names a directory, device, FIFO or socket.
	ErrNotRegularFile = errors.New("not a regular file")
	// ErrRelativeRegionPath: the path is not absolute.
	ErrRelativeRegionPath = errors.New("not an absolute path")
)

// RegionPathError is RegisterRegion's refusal of a region file path.
type RegionPathError struct {
	Path string // as the caller named it
	Dir  string // the region directory (--region-dir)
	Err  error
}

func (e *RegionPathError) Error() string {
	return fmt.Sprintf("region path %q: %v (--region-dir %s)", e.Path, e.Err, e.Dir)
}

func (e *RegionPathError) Unwrap() error { return e.Err }

// regionDir confines the region files RegisterRegion maps to one
// directory. The agent creates, grows and maps the file a gRPC caller
// names, and it runs with the node's capabilities: without the bound any
// caller could create or overwrite any file the agent can reach.
type regionDir struct {
	dir  string   // as configured, cleaned
	real []string // dir and, when it differs, dir with its symlinks resolved
	root *os.Root // opens below dir only, whatever is renamed meanwhile
}

func openRegionDir(dir string) (*regionDir, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("region directory %q (--region-dir) must be an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("region directory (--region-dir): %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("region directory (--region-dir): %w", err)
	}
	d := &regionDir{dir: dir, real: []string{dir}, root: root}
	if real != dir {
		d.real = append(d.real, real)
	}
	return d, nil
}

func (d *regionDir) close() error { return d.root.Close() }

// open opens, read-write and created when missing, the region file at
// path: an absolute path without "..", below the directory, that leads to
// a regular file there, symlinks included.
func (d *regionDir) open(path string) (*os.File, error) {
	refuse := func(err error) error { return &RegionPathError{Path: path, Dir: d.dir, Err: err} }
	if !filepath.IsAbs(path) {
		return nil, refuse(ErrRelativeRegionPath)
	}
	if slices.Contains(strings.Split(path, "/"), "..") {
		return nil, refuse(fmt.Errorf("%w: the path has a \"..\" element", ErrOutsideRegionDir))
	}
	rel, ok := d.below(filepath.Clean(path))
	if !ok {
		return nil, refuse(ErrOutsideRegionDir)
	}
	// Where the path leads now, for a refusal that says why; the root
	// below enforces it against a symlink swapped in meanwhile.
	target, err := filepath.EvalSymlinks(path)
	if errors.Is(err, fs.ErrNotExist) {
		// To be created: its folder must lie inside.
		target, err = filepath.EvalSymlinks(filepath.Dir(path))
		target = filepath.Join(target, filepath.Base(path))
	}
	if err != nil {
		return nil, refuse(err)
	}
	if _, ok := d.below(target); !ok {
		return nil, refuse(fmt.Errorf("%w: it leads to %s", ErrOutsideRegionDir, target))
	}
	if st, err := os.Stat(target); err == nil && !st.Mode().IsRegular() {
		return nil, refuse(fmt.Errorf("%w (%s)", ErrNotRegularFile, st.Mode().Type()))
	}
	// O_NONBLOCK: a FIFO swapped in after the check must not hang the
	// call; the check after the open refuses it.
	f, err := d.root.OpenFile(rel, os.O_RDWR|os.O_CREATE|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0o600)
	if err != nil {
		return nil, refuse(err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = fmt.Errorf("%w (%s)", ErrNotRegularFile, st.Mode().Type())
		}
		return nil, refuse(err)
	}
	return f, nil
}

// below returns path relative to the directory when it lies strictly
// inside it (the configured path or the resolved one).
func (d *regionDir) below(path string) (string, bool) {
	for _, dir := range d.real {
		rel, err := filepath.Rel(dir, path)
		if err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../") {
			return rel, true
		}
	}
	return "", false
}
