package batch

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrNotFound is returned by a Store for an unknown id.
var ErrNotFound = errors.New("not found")

// FileRecord is a stored file: the API object and who owns it.
type FileRecord struct {
	File
	Tenant string `json:"tenant"`
}

// BatchRecord is a stored batch: the API object and what only the server
// needs.
type BatchRecord struct {
	Batch
	Tenant string `json:"tenant"`
	// OutputExpiresAfter is the lifetime, in seconds from their creation, of
	// the output and error files (0: they do not expire).
	OutputExpiresAfter int64 `json:"output_expires_after_seconds,omitempty"`
}

// Store holds the records, the queue of jobs and who processes which. Both
// implementations pass the same suite (store_test.go). Records are whole
// JSON documents: an update is a read-modify-write under the store's own
// atomicity (a bbolt transaction, a Redis WATCH).
type Store interface {
	PutFile(ctx context.Context, f FileRecord) error
	GetFile(ctx context.Context, id string) (FileRecord, error)
	DeleteFile(ctx context.Context, id string) error
	// ListFiles returns every file, newest first (ids sort by creation).
	ListFiles(ctx context.Context) ([]FileRecord, error)

	CreateBatch(ctx context.Context, b BatchRecord) error
	GetBatch(ctx context.Context, id string) (BatchRecord, error)
	// UpdateBatch applies fn to the stored record atomically and stores
	// the result; fn's error aborts the update and is returned.
	UpdateBatch(ctx context.Context, id string, fn func(*BatchRecord) error) (BatchRecord, error)
	// ListBatches returns every batch, newest first.
	ListBatches(ctx context.Context) ([]BatchRecord, error)
	// Active lists the batches not yet in a final status.
	Active(ctx context.Context) ([]string, error)

	// Enqueue queues a job by deadline unless it is queued already.
	Enqueue(ctx context.Context, id string, deadline time.Time) error
	// Dequeue pops the job with the earliest deadline, waiting up to wait
	// for one; "" when none came.
	Dequeue(ctx context.Context, wait time.Duration) (string, error)
	// Lease claims a job for owner for ttl, or renews owner's claim; false
	// when another owner holds it.
	Lease(ctx context.Context, id, owner string, ttl time.Duration) (bool, error)
	Unlease(ctx context.Context, id, owner string) error

	Close() error
}

// applyUpdate is UpdateBatch's step inside either store's transaction:
// decode the stored record, apply fn, encode the result.
func applyUpdate(raw []byte, fn func(*BatchRecord) error) (BatchRecord, []byte, error) {
	var b BatchRecord
	if err := json.Unmarshal(raw, &b); err != nil {
		return b, nil, err
	}
	if err := fn(&b); err != nil {
		return b, nil, err
	}
	out, err := json.Marshal(b)
	return b, out, err
}
