package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisStore keeps records, queue and leases in Redis or Valkey, in llm-d's
// batch-gateway layout:
//
//	llmd_batch:store:file:<id>, llmd_batch:store:batch:<id>  HASH {data (JSON), tenant[, status]}
//	llmd_batch:queue:priority  ZSET of job ids, score = deadline in Unix µs (ZADD NX, BZMPOP MIN)
//	llmd_batch:status:<id>     STRING, the batch's status, with a TTL
//
// and, for what llm-d keeps elsewhere, kvgate's own keys under the same
// prefix: llmd_batch:index:{file,batch} (SETs of ids), llmd_batch:active
// (SET of non-final batches), llmd_batch:lease:<id> (STRING owner, PX ttl).
type redisStore struct{ rdb *redis.Client }

const (
	redisPrefix     = "llmd_batch:"
	redisQueue      = redisPrefix + "queue:priority"
	redisActive     = redisPrefix + "active"
	redisStatusTTL  = 30 * 24 * time.Hour
	redisUpdateTrys = 50
)

func redisRecordKey(kind, id string) string { return redisPrefix + "store:" + kind + ":" + id }
func redisIndexKey(kind string) string      { return redisPrefix + "index:" + kind }

func openRedis(ctx context.Context, url string) (*redisStore, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis %s: %w", opt.Addr, err)
	}
	return &redisStore{rdb: rdb}, nil
}

func (s *redisStore) Close() error { return s.rdb.Close() }

func (s *redisStore) PutFile(ctx context.Context, f FileRecord) error {
	raw, err := json.Marshal(f)
	if err != nil {
		return err
	}
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, redisRecordKey("file", f.ID), "data", raw, "tenant", f.Tenant)
		p.SAdd(ctx, redisIndexKey("file"), f.ID)
		return nil
	})
	return err
}

func redisGet[T any](ctx context.Context, s *redisStore, kind, id string) (T, error) {
	var v T
	raw, err := s.rdb.HGet(ctx, redisRecordKey(kind, id), "data").Bytes()
	if errors.Is(err, redis.Nil) {
		return v, ErrNotFound
	}
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal(raw, &v)
}

func (s *redisStore) GetFile(ctx context.Context, id string) (FileRecord, error) {
	return redisGet[FileRecord](ctx, s, "file", id)
}

func (s *redisStore) DeleteFile(ctx context.Context, id string) error {
	var del *redis.IntCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		del = p.Del(ctx, redisRecordKey("file", id))
		p.SRem(ctx, redisIndexKey("file"), id)
		return nil
	})
	if err == nil && del.Val() == 0 {
		return ErrNotFound
	}
	return err
}

// redisList loads every record of a kind, newest (largest id) first. Ids
// whose record is gone are dropped from the index.
func redisList[T any](ctx context.Context, s *redisStore, kind string) ([]T, error) {
	ids, err := s.rdb.SMembers(ctx, redisIndexKey(kind)).Result()
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	slices.Reverse(ids)
	out := make([]T, 0, len(ids))
	for chunk := range slices.Chunk(ids, 256) {
		cmds := make([]*redis.StringCmd, len(chunk))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range chunk {
				cmds[i] = p.HGet(ctx, redisRecordKey(kind, id), "data")
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		for i, c := range cmds {
			raw, err := c.Bytes()
			if errors.Is(err, redis.Nil) {
				s.rdb.SRem(ctx, redisIndexKey(kind), chunk[i])
				continue
			}
			var v T
			if err == nil {
				err = json.Unmarshal(raw, &v)
			}
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", kind, chunk[i], err)
			}
			out = append(out, v)
		}
	}
	return out, nil
}

func (s *redisStore) ListFiles(ctx context.Context) ([]FileRecord, error) {
	return redisList[FileRecord](ctx, s, "file")
}

func writeBatch(ctx context.Context, p redis.Pipeliner, b BatchRecord, raw []byte) {
	p.HSet(ctx, redisRecordKey("batch", b.ID), "data", raw, "tenant", b.Tenant, "status", b.Status)
	p.Set(ctx, redisPrefix+"status:"+b.ID, b.Status, redisStatusTTL)
	if final(b.Status) {
		p.SRem(ctx, redisActive, b.ID)
	} else {
		p.SAdd(ctx, redisActive, b.ID)
	}
}

func (s *redisStore) CreateBatch(ctx context.Context, b BatchRecord) error {
	raw, err := json.Marshal(b)
	if err != nil {
		return err
	}
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		writeBatch(ctx, p, b, raw)
		p.SAdd(ctx, redisIndexKey("batch"), b.ID)
		return nil
	})
	return err
}

func (s *redisStore) GetBatch(ctx context.Context, id string) (BatchRecord, error) {
	return redisGet[BatchRecord](ctx, s, "batch", id)
}

func (s *redisStore) UpdateBatch(ctx context.Context, id string, fn func(*BatchRecord) error) (BatchRecord, error) {
	key := redisRecordKey("batch", id)
	var b BatchRecord
	for range redisUpdateTrys {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			raw, err := tx.HGet(ctx, key, "data").Bytes()
			if errors.Is(err, redis.Nil) {
				return ErrNotFound
			}
			if err != nil {
				return err
			}
			var out []byte
			if b, out, err = applyUpdate(raw, fn); err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				writeBatch(ctx, p, b, out)
				return nil
			})
			return err
		}, key)
		if !errors.Is(err, redis.TxFailedErr) {
			return b, err
		}
	}
	return b, fmt.Errorf("batch %s: update kept conflicting", id)
}

func (s *redisStore) ListBatches(ctx context.Context) ([]BatchRecord, error) {
	return redisList[BatchRecord](ctx, s, "batch")
}

func (s *redisStore) Active(ctx context.Context) ([]string, error) {
	return s.rdb.SMembers(ctx, redisActive).Result()
}

func (s *redisStore) Enqueue(ctx context.Context, id string, deadline time.Time) error {
	return s.rdb.ZAddNX(ctx, redisQueue, redis.Z{Score: float64(deadline.UnixMicro()), Member: id}).Err()
}

func (s *redisStore) Dequeue(ctx context.Context, wait time.Duration) (string, error) {
	_, zs, err := s.rdb.BZMPop(ctx, wait, "min", 1, redisQueue).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if len(zs) == 0 {
		return "", nil
	}
	return fmt.Sprint(zs[0].Member), nil
}

// leaseScript takes or renews a lease: SET NX, or PEXPIRE when the caller
// already holds it.
var leaseScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0`)

var unleaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

func (s *redisStore) Lease(ctx context.Context, id, owner string, ttl time.Duration) (bool, error) {
	n, err := leaseScript.Run(ctx, s.rdb, []string{redisPrefix + "lease:" + id}, owner, ttl.Milliseconds()).Int()
	return n == 1, err
}

func (s *redisStore) Unlease(ctx context.Context, id, owner string) error {
	return unleaseScript.Run(ctx, s.rdb, []string{redisPrefix + "lease:" + id}, owner).Err()
}
