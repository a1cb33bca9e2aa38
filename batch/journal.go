package batch

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// record is one line's result in a job's journal: the output line as it
// will appear in the output file (or, Failed, in the error file).
type record struct {
	Line   int             `json:"line"`
	Failed bool            `json:"failed,omitempty"`
	Usage  *Usage          `json:"usage,omitempty"`
	Out    json.RawMessage `json:"out"`
}

// journal is a job's append-only result log. A record counts once it is
// fsync'd: appends write at once and share fsyncs (group commit).
type journal struct {
	f       *os.File
	mu      sync.Mutex // guards written, size
	written uint64
	size    int64
	syncMu  sync.Mutex // guards synced; held across the fsync
	synced  uint64
}

// openJournal opens (creating) the journal at path and replays it: each
// record is passed to replay. A torn last record (a crash mid-write) is cut
// off. A record for a line already seen is dropped, so replay sees each
// line at most once.
func openJournal(path string, replay func(record)) (*journal, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	good, err := scanJournal(f, replay)
	if err == nil {
		err = f.Truncate(good)
	}
	if err == nil {
		_, err = f.Seek(good, io.SeekStart)
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	return &journal{f: f, size: good}, nil
}

// scanJournal returns the length of the journal's whole records.
func scanJournal(r io.Reader, replay func(record)) (int64, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	seen := map[int]bool{}
	var good int64
	for {
		raw, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return good, nil // a partial last line is dropped
		}
		if err != nil {
			return 0, err
		}
		var rec record
		if json.Unmarshal(raw, &rec) != nil || rec.Line <= 0 {
			return good, nil
		}
		good += int64(len(raw))
		if !seen[rec.Line] {
			seen[rec.Line] = true
			replay(rec)
		}
	}
}

// append writes rec and returns once it is durable.
func (j *journal) append(rec record) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	raw = append(raw, '\n')
	j.mu.Lock()
	_, err = j.f.Write(raw)
	if err != nil {
		// Cut a partial write off so the journal stays a sequence of records.
		_ = j.f.Truncate(j.size)
		_, _ = j.f.Seek(j.size, io.SeekStart)
		j.mu.Unlock()
		return err
	}
	j.size += int64(len(raw))
	j.written++
	seq := j.written
	j.mu.Unlock()

	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced >= seq {
		return nil
	}
	j.mu.Lock()
	upTo := j.written
	j.mu.Unlock()
	if err := j.f.Sync(); err != nil {
		return err
	}
	j.synced = upTo
	return nil
}

func (j *journal) close() error { return j.f.Close() }
