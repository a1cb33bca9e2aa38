package seriescache

import "sync"

// Cache maps label sets K to their resolved series V; it is safe for
// concurrent use, and a hit takes only a read lock.
type Cache[K comparable, V any] struct {
	max     int
	resolve func(K) *V

	mu sync.RWMutex
	m  map[K]*V
}

// New returns a cache of at most limit entries (at least 1) whose misses
// call resolve, under the cache's lock, to make k's value.
func New[K comparable, V any](limit int, resolve func(K) *V) *Cache[K, V] {
	return &Cache[K, V]{max: max(1, limit), resolve: resolve, m: map[K]*V{}}
}

// Get returns k's value, resolving it on the first use of k (or the first
// since it was evicted or deleted).
func (c *Cache[K, V]) Get(k K) *V {
	c.mu.RLock()
	v := c.m[k]
	c.mu.RUnlock()
	if v != nil {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v = c.m[k]; v != nil {
		return v
	}
	if len(c.m) >= c.max {
		for old := range c.m {
			delete(c.m, old)
			break
		}
	}
	v = c.resolve(k)
	c.m[k] = v
	return v
}

// Delete forgets k's value, which its owner has deleted from the vectors:
// the next Get resolves it again instead of writing to a series no longer
// exported.
func (c *Cache[K, V]) Delete(k K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
}

// Len is the number of cached label sets.
func (c *Cache[K, V]) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}
