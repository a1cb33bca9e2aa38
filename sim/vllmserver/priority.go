package vllmserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// requestPriority reads the body's "priority" the way vLLM's request model
// (an int field, default 0, validated by pydantic in its lax mode) does: an
// integer, a float with no fractional part, a string holding an integer, or
// a boolean; anything else, null included, is a 400.
func requestPriority(raw json.RawMessage) (int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, nil
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return 0, errors.New("priority: Input should be a valid integer")
	}
	switch x := v.(type) {
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	case json.Number:
		return numberPriority(string(x))
	case string:
		return stringPriority(x)
	}
	return 0, errors.New("priority: Input should be a valid integer")
}

func numberPriority(s string) (int, error) {
	if n, err := strconv.ParseInt(s, 10, 0); err == nil {
		return int(n), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return 0, errors.New("priority: Input should be a valid integer")
	case f != math.Trunc(f):
		return 0, errors.New("priority: Input should be a valid integer, got a number with a fractional part")
	case math.Abs(f) > math.MaxInt64/2:
		// Python's int has no bound; the engine's does, and no fleet ranks
		// requests that far apart.
		return 0, errors.New("priority: out of range")
	}
	return int(f), nil
}

func stringPriority(s string) (int, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 0)
	if err != nil {
		return 0, errors.New("priority: Input should be a valid integer, unable to parse string as an integer")
	}
	return int(n), nil
}
