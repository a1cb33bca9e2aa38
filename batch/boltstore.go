package batch

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// boltStore is the embedded Store: one bbolt file. bbolt locks the file, so
// only one process has the store and its leases live in that process.
type boltStore struct {
	db     *bolt.DB
	wake   chan struct{} // signalled by Enqueue
	mu     sync.Mutex
	leases map[string]lease
}

type lease struct {
	owner string
	until time.Time
}

var (
	bucketFiles   = []byte("files")
	bucketBatches = []byte("batches")
	bucketActive  = []byte("active")
	bucketQueue   = []byte("queue")  // deadline(8 bytes, µs) + id → id
	bucketQueued  = []byte("queued") // id → queue key, for NX
)

func openBolt(path string) (*boltStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketFiles, bucketBatches, bucketActive, bucketQueue, bucketQueued} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &boltStore{db: db, wake: make(chan struct{}, 1), leases: map[string]lease{}}, nil
}

func (s *boltStore) Close() error { return s.db.Close() }

func (s *boltStore) put(bucket []byte, id string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(id), raw) })
}

func boltGet[T any](s *boltStore, bucket []byte, id string) (T, error) {
	var v T
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucket).Get([]byte(id))
		if raw == nil {
			return ErrNotFound
		}
		return json.Unmarshal(raw, &v)
	})
	return v, err
}

// boltList returns a bucket's values in descending key order.
func boltList[T any](s *boltStore, bucket []byte) ([]T, error) {
	var out []T
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucket).Cursor()
		for k, raw := c.Last(); k != nil; k, raw = c.Prev() {
			var v T
			if err := json.Unmarshal(raw, &v); err != nil {
				return fmt.Errorf("record %s: %w", k, err)
			}
			out = append(out, v)
		}
		return nil
	})
	return out, err
}

func (s *boltStore) PutFile(_ context.Context, f FileRecord) error {
	return s.put(bucketFiles, f.ID, f)
}

func (s *boltStore) GetFile(_ context.Context, id string) (FileRecord, error) {
	return boltGet[FileRecord](s, bucketFiles, id)
}

func (s *boltStore) DeleteFile(_ context.Context, id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketFiles)
		if b.Get([]byte(id)) == nil {
			return ErrNotFound
		}
		return b.Delete([]byte(id))
	})
}

func (s *boltStore) ListFiles(context.Context) ([]FileRecord, error) {
	return boltList[FileRecord](s, bucketFiles)
}

func (s *boltStore) CreateBatch(_ context.Context, b BatchRecord) error {
	raw, err := json.Marshal(b)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketBatches).Put([]byte(b.ID), raw); err != nil {
			return err
		}
		return setActive(tx, b)
	})
}

func setActive(tx *bolt.Tx, b BatchRecord) error {
	if final(b.Status) {
		return tx.Bucket(bucketActive).Delete([]byte(b.ID))
	}
	return tx.Bucket(bucketActive).Put([]byte(b.ID), nil)
}

func (s *boltStore) GetBatch(_ context.Context, id string) (BatchRecord, error) {
	return boltGet[BatchRecord](s, bucketBatches, id)
}

func (s *boltStore) UpdateBatch(_ context.Context, id string, fn func(*BatchRecord) error) (BatchRecord, error) {
	var b BatchRecord
	err := s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketBatches)
		raw := bk.Get([]byte(id))
		if raw == nil {
			return ErrNotFound
		}
		var out []byte
		var err error
		if b, out, err = applyUpdate(raw, fn); err != nil {
			return err
		}
		if err := bk.Put([]byte(id), out); err != nil {
			return err
		}
		return setActive(tx, b)
	})
	return b, err
}

func (s *boltStore) ListBatches(context.Context) ([]BatchRecord, error) {
	return boltList[BatchRecord](s, bucketBatches)
}

func (s *boltStore) Active(context.Context) ([]string, error) {
	var ids []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketActive).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	return ids, err
}

func (s *boltStore) Enqueue(_ context.Context, id string, deadline time.Time) error {
	key := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(key, uint64(max(deadline.UnixMicro(), 0)))
	key = append(key, id...)
	err := s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketQueued).Get([]byte(id)) != nil {
			return nil
		}
		if err := tx.Bucket(bucketQueued).Put([]byte(id), key); err != nil {
			return err
		}
		return tx.Bucket(bucketQueue).Put(key, []byte(id))
	})
	if err == nil {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return err
}

func (s *boltStore) pop() (string, error) {
	var id string
	err := s.db.Update(func(tx *bolt.Tx) error {
		k, v := tx.Bucket(bucketQueue).Cursor().First()
		if k == nil {
			return nil
		}
		id = string(v)
		if err := tx.Bucket(bucketQueue).Delete(k); err != nil {
			return err
		}
		return tx.Bucket(bucketQueued).Delete(v)
	})
	return id, err
}

func (s *boltStore) Dequeue(ctx context.Context, wait time.Duration) (string, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		id, err := s.pop()
		if id != "" || err != nil {
			return id, err
		}
		select {
		case <-s.wake:
		case <-t.C:
			return "", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

func (s *boltStore) Lease(_ context.Context, id, owner string, ttl time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if l, ok := s.leases[id]; ok && l.owner != owner && now.Before(l.until) {
		return false, nil
	}
	s.leases[id] = lease{owner: owner, until: now.Add(ttl)}
	return true, nil
}

func (s *boltStore) Unlease(_ context.Context, id, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.leases[id]; ok && l.owner == owner {
		delete(s.leases, id)
	}
	return nil
}
