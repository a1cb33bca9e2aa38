package scheduling

// CycleState carries data between the plugins of one scheduling cycle (one
// request), for example prefix hashes a scorer computed and its PreRequest
// hook reuses. It is owned by the request: no locking, no sharing across
// requests.
type CycleState struct {
	data map[string]any
}

// NewCycleState returns an empty state.
func NewCycleState() *CycleState { return &CycleState{} }

// Write stores a value under key. Keys are namespaced by plugin type by
// convention ("prefix-cache-scorer/hashes").
func (c *CycleState) Write(key string, v any) {
	if c.data == nil {
		c.data = make(map[string]any, 4)
	}
	c.data[key] = v
}

// Read returns the value under key.
func (c *CycleState) Read(key string) (any, bool) {
	v, ok := c.data[key]
	return v, ok
}

// ReadAs returns the value under key if it has type T.
func ReadAs[T any](c *CycleState, key string) (T, bool) {
	v, ok := c.data[key]
	if !ok {
		var zero T
		return zero, false
	}
	t, ok := v.(T)
	return t, ok
}
