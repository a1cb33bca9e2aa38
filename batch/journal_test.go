package batch

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestJournalReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	j, err := openJournal(path, func(record) { t.Fatal("replay of a new journal") })
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 1; i <= 50; i++ {
		wg.Go(func() {
			if err := j.append(record{Line: i, Failed: i%7 == 0, Out: json.RawMessage(`{"custom_id":"x"}`)}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// A duplicate of line 3 (never written by the processor, but replay
	// must not count a line twice) and a torn record, as a crash leaves it.
	if err := j.append(record{Line: 3, Out: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	j.close()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"line":51,"out":{"cus`)
	f.Close()

	lines := map[int]int{}
	failed := 0
	j, err = openJournal(path, func(r record) {
		lines[r.Line]++
		if r.Failed {
			failed++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 50 || lines[51] != 0 || failed != 7 {
		t.Fatalf("replayed %d lines (51: %d), %d failed", len(lines), lines[51], failed)
	}
	for l, n := range lines {
		if n != 1 {
			t.Errorf("line %d replayed %d times", l, n)
		}
	}
	// The torn tail is gone: a new record follows the last whole one.
	if err := j.append(record{Line: 51, Out: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	j.close()
	n := 0
	j, err = openJournal(path, func(record) { n++ })
	if err != nil {
		t.Fatal(err)
	}
	j.close()
	if n != 51 {
		t.Errorf("after the repair: %d records, want 51", n)
	}
}
