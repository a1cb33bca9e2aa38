package batch

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil/redistest"
)

// stores runs fn against each Store: the embedded one and a real Redis.
func stores(t *testing.T, fn func(t *testing.T, s Store)) {
	t.Run("bolt", func(t *testing.T) {
		s, err := openBolt(filepath.Join(t.TempDir(), "b.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		fn(t, s)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		s, err := openRedis(t.Context(), "redis://"+srv.Addr+"/0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		fn(t, s)
	})
}

func TestStoreFiles(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		ctx := t.Context()
		var ids []string
		for i := range 3 {
			f := FileRecord{Tenant: "a", File: File{ID: newID("file-", 4), Object: "file", Bytes: int64(i), Purpose: PurposeBatch}}
			if err := s.PutFile(ctx, f); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, f.ID)
		}
		got, err := s.GetFile(ctx, ids[1])
		if err != nil || got.Bytes != 1 || got.Tenant != "a" {
			t.Fatalf("get: %+v %v", got, err)
		}
		all, err := s.ListFiles(ctx)
		if err != nil || len(all) != 3 || all[0].ID != ids[2] || all[2].ID != ids[0] {
			t.Fatalf("list (want newest first): %+v %v", all, err)
		}
		if err := s.DeleteFile(ctx, ids[1]); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteFile(ctx, ids[1]); !errors.Is(err, ErrNotFound) {
			t.Errorf("second delete: %v", err)
		}
		if _, err := s.GetFile(ctx, ids[1]); !errors.Is(err, ErrNotFound) {
			t.Errorf("get deleted: %v", err)
		}
		if all, _ := s.ListFiles(ctx); len(all) != 2 {
			t.Errorf("list after delete: %d", len(all))
		}
	})
}

func TestStoreBatches(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		ctx := t.Context()
		b := BatchRecord{Tenant: "a", Batch: Batch{ID: newID("batch_", 8), Object: "batch", Status: StatusValidating}}
		if err := s.CreateBatch(ctx, b); err != nil {
			t.Fatal(err)
		}
		if active, _ := s.Active(ctx); len(active) != 1 || active[0] != b.ID {
			t.Errorf("active: %v", active)
		}
		// Concurrent read-modify-writes must not lose an update.
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				if _, err := s.UpdateBatch(ctx, b.ID, func(r *BatchRecord) error { r.RequestCounts.Completed++; return nil }); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		got, err := s.GetBatch(ctx, b.ID)
		if err != nil || got.RequestCounts.Completed != 20 {
			t.Fatalf("after 20 updates: %+v %v", got.RequestCounts, err)
		}
		abort := errors.New("abort")
		if _, err := s.UpdateBatch(ctx, b.ID, func(r *BatchRecord) error { r.Status = StatusFailed; return abort }); !errors.Is(err, abort) {
			t.Errorf("aborted update: %v", err)
		}
		if got, _ := s.GetBatch(ctx, b.ID); got.Status != StatusValidating {
			t.Errorf("aborted update was stored: %s", got.Status)
		}
		if _, err := s.UpdateBatch(ctx, b.ID, func(r *BatchRecord) error { r.Status = StatusCompleted; return nil }); err != nil {
			t.Fatal(err)
		}
		if active, _ := s.Active(ctx); len(active) != 0 {
			t.Errorf("a completed batch is still active: %v", active)
		}
		if _, err := s.UpdateBatch(ctx, "batch_none", func(*BatchRecord) error { return nil }); !errors.Is(err, ErrNotFound) {
			t.Errorf("update unknown: %v", err)
		}
		b2 := BatchRecord{Batch: Batch{ID: newID("batch_", 8), Status: StatusInProgress}}
		if err := s.CreateBatch(ctx, b2); err != nil {
			t.Fatal(err)
		}
		if all, err := s.ListBatches(ctx); err != nil || len(all) != 2 || all[0].ID != b2.ID {
			t.Errorf("list: %v %v", all, err)
		}
	})
}

func TestStoreQueueAndLeases(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		ctx := t.Context()
		base := time.Now()
		for _, id := range []string{"late", "early", "mid"} {
			d := map[string]time.Duration{"early": time.Hour, "mid": 2 * time.Hour, "late": 3 * time.Hour}[id]
			if err := s.Enqueue(ctx, id, base.Add(d)); err != nil {
				t.Fatal(err)
			}
		}
		// NX: queuing again neither duplicates nor moves it.
		if err := s.Enqueue(ctx, "late", base); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"early", "mid", "late", ""} {
			got, err := s.Dequeue(ctx, 100*time.Millisecond)
			if err != nil || got != want {
				t.Fatalf("dequeue: %q %v, want %q", got, err, want)
			}
		}
		// A waiting Dequeue gets a job queued meanwhile.
		got := make(chan string, 1)
		go func() {
			id, _ := s.Dequeue(ctx, 5*time.Second)
			got <- id
		}()
		time.Sleep(50 * time.Millisecond)
		if err := s.Enqueue(ctx, "later", base); err != nil {
			t.Fatal(err)
		}
		if id := <-got; id != "later" {
			t.Errorf("waiting dequeue got %q", id)
		}

		// A's lease must outlive B's try. When the machine took longer
		// than the lease to get there, B may rightly take it: the check
		// is made again with a longer lease (once B lets go) rather than
		// failed. The sleep then outlasts A's renewal.
		ttl := time.Second
		for {
			start := time.Now()
			ok, err := s.Lease(ctx, "j", "A", ttl)
			if err != nil || !ok {
				t.Fatalf("first lease: %v %v", ok, err)
			}
			took, _ := s.Lease(ctx, "j", "B", time.Second)
			if !took {
				break
			}
			if time.Since(start) < ttl {
				t.Fatal("B took A's lease")
			}
			if err := s.Unlease(ctx, "j", "B"); err != nil {
				t.Fatal(err)
			}
			if ttl *= 2; ttl > 16*time.Second {
				t.Fatal("B's try never came within A's lease")
			}
		}
		if ok, _ := s.Lease(ctx, "j", "A", ttl); !ok {
			t.Error("A could not renew")
		}
		time.Sleep(ttl + ttl/4)
		// B's lease must outlive the checks below (its unlease ends it).
		if ok, _ := s.Lease(ctx, "j", "B", time.Minute); !ok {
			t.Error("B could not take an expired lease")
		}
		if err := s.Unlease(ctx, "j", "A"); err != nil {
			t.Fatal(err)
		}
		if ok, _ := s.Lease(ctx, "j", "A", time.Second); ok {
			t.Error("A's unlease released B's lease")
		}
		if err := s.Unlease(ctx, "j", "B"); err != nil {
			t.Fatal(err)
		}
		if ok, _ := s.Lease(ctx, "j", "A", time.Second); !ok {
			t.Error("lease not free after unlease")
		}
	})
}

// TestRedisKeyLayout: the records, queue and status sit at llm-d's keys.
func TestRedisKeyLayout(t *testing.T) {
	srv := redistest.Start(t)
	s, err := openRedis(t.Context(), "redis://"+srv.Addr+"/0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	b := BatchRecord{Batch: Batch{ID: "batch_x", Status: StatusInProgress}}
	if err := s.CreateBatch(ctx, b); err != nil {
		t.Fatal(err)
	}
	deadline := time.UnixMicro(1_800_000_000_123_456)
	if err := s.Enqueue(ctx, b.ID, deadline); err != nil {
		t.Fatal(err)
	}
	if typ, _ := s.rdb.Type(ctx, "llmd_batch:store:batch:batch_x").Result(); typ != "hash" {
		t.Errorf("record key type %q", typ)
	}
	if st, _ := s.rdb.Get(ctx, "llmd_batch:status:batch_x").Result(); st != StatusInProgress {
		t.Errorf("status key %q", st)
	}
	if ttl, _ := s.rdb.TTL(ctx, "llmd_batch:status:batch_x").Result(); ttl <= 0 {
		t.Errorf("status key without TTL: %v", ttl)
	}
	score, err := s.rdb.ZScore(ctx, "llmd_batch:queue:priority", "batch_x").Result()
	if err != nil || int64(score) != deadline.UnixMicro() {
		t.Errorf("queue score %v (%v), want the deadline in µs %d", score, err, deadline.UnixMicro())
	}
}
