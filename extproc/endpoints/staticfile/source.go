package staticfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// DefaultDebounce is how long the directory must stay quiet after a change
// before the file is re-read: long enough to coalesce an editor's
// write-rename-chmod burst, short next to any human or controller edit.
const DefaultDebounce = 100 * time.Millisecond

// File is an endpoints.Source backed by a YAML file (see Parse).
//
// It watches the file's directory rather than the file: editors save by
// writing a temporary file and renaming it over the original, and Kubernetes
// updates a mounted ConfigMap by swapping a "..data" symlink, and neither
// produces an event on a watch of the old file. Any event in the directory
// schedules a re-read; content identical to the last applied set is ignored.
type File struct {
	// Path of the YAML file.
	Path string
	// Debounce; zero means DefaultDebounce.
	Debounce time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// LLMD reads llm-d's file-discovery format (ParseLLMD) instead of
	// kvgate's (Parse).
	LLMD bool
	// Hosts, with LLMD, lets addresses be DNS names (ParseLLMDHosts).
	Hosts bool
	// NoWatch reads the file once (llm-d's watchFile: false).
	NoWatch bool
}

var _ endpoints.Source = (*File)(nil)

// Run applies the file's endpoints, then every valid edit, until ctx is
// done. A missing or invalid file at start is an error, so that a
// misconfigured picker fails loudly; later invalid edits (and deletions)
// are logged and the previous set stays in force.
func (f *File) Run(ctx context.Context, apply func([]endpoints.Spec) error) error {
	log := f.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("file", f.Path)
	debounce := f.Debounce
	if debounce <= 0 {
		debounce = DefaultDebounce
	}

	if f.NoWatch {
		_, n, err := f.load(nil, 0, apply, log)
		if err != nil {
			return fmt.Errorf("static endpoints %s: %w", f.Path, err)
		}
		log.Info("static endpoints loaded, not watched", "endpoints", n)
		<-ctx.Done()
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("static endpoints: %w", err)
	}
	defer w.Close()
	// Watch before the first read so that no edit falls between the two.
	if err := w.Add(filepath.Dir(f.Path)); err != nil {
		return fmt.Errorf("static endpoints: watch %s: %w", filepath.Dir(f.Path), err)
	}

	applied, n, err := f.load(nil, 0, apply, log)
	for try := 1; err != nil && try < initialReads; try++ {
		// The file may be caught mid-rewrite (truncated, half written):
		// read it again a debounce later before calling it broken.
		log.Warn("static endpoints do not parse; reading the file again", "err", err, "try", try)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(debounce):
		}
		applied, n, err = f.load(nil, 0, apply, log)
	}
	if err != nil {
		return fmt.Errorf("static endpoints %s: %w", f.Path, err)
	}
	log.Info("static endpoints loaded", "endpoints", n)
	current := n

	timer := time.NewTimer(debounce)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return errors.New("static endpoints: watcher closed")
			}
			timer.Reset(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("static endpoints: watcher closed")
			}
			// An overflow loses events: re-read to be sure.
			log.Warn("file watch error; re-reading", "err", err)
			timer.Reset(debounce)
		case <-timer.C:
			data, n, err := f.load(applied, current, apply, log)
			switch {
			case err != nil:
				log.Error("static endpoints not updated; keeping the previous set", "err", err, "endpoints", current)
			case data != nil:
				applied, current = data, n
				log.Info("static endpoints updated", "endpoints", n)
			}
		}
	}
}

// initialReads is how often a watched file that does not parse at start is
// read, a debounce apart, before the source gives up on it.
const initialReads = 5

// ErrWouldEmpty refuses an edit that leaves no endpoint in a pool that has
// some: a truncated or half-written file must not take every server out of
// service. An empty file at start is accepted (an empty pool is known).
var ErrWouldEmpty = errors.New("the edit lists no endpoints; refusing to empty the pool")

// load reads and applies the file unless its content equals prev. It
// returns the applied content and its endpoint count; nil content when
// nothing changed. current is the count in force.
func (f *File) load(prev []byte, current int, apply func([]endpoints.Spec) error, log *slog.Logger) ([]byte, int, error) {
	data, err := readFile(f.Path)
	if err != nil {
		return nil, 0, err
	}
	if prev != nil && bytes.Equal(data, prev) {
		return nil, 0, nil
	}
	var specs []endpoints.Spec
	if f.LLMD {
		var skipped []error
		specs, skipped, err = parseLLMD(data, f.Hosts)
		for _, s := range skipped {
			log.Warn("endpoint skipped", "err", s)
		}
	} else {
		specs, err = Parse(data)
	}
	if err != nil {
		return nil, 0, err
	}
	if prev != nil && current > 0 && len(specs) == 0 {
		return nil, 0, ErrWouldEmpty
	}
	if err := apply(specs); err != nil {
		return nil, 0, fmt.Errorf("rejected: %w", err)
	}
	return data, len(specs), nil
}

func readFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileBytes)
	}
	return data, nil
}
