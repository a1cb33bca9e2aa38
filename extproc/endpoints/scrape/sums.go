package scrape

import "bytes"

// Sums reads the named series of a Prometheus text-format page, each
// summed over its label sets; a name absent from the page is absent from
// the result, and without names every series is read. It is Parse's reader for callers that want other series
// than the picker's (the demo reads the simulators' counters): lines of
// other series are skipped unread, a malformed line of a named one is a
// *ParseError.
func Sums(page []byte, names ...string) (map[string]float64, error) {
	out := make(map[string]float64, len(names))
	want := func(name []byte) bool {
		if len(names) == 0 {
			return true
		}
		for _, n := range names {
			if string(name) == n {
				return true
			}
		}
		return false
	}
	err := eachSample(page, func(line []byte) *ParseError {
		var (
			lbl        labels
			name, rest []byte
			err        error
		)
		if line[0] == '{' { // UTF-8 exposition: the name is inside the braces
			if name, rest, err = lbl.parse(line, true); err != nil {
				return &ParseError{Err: err}
			}
			if !want(name) {
				return nil
			}
		} else {
			i := bytes.IndexAny(line, "{ \t")
			if i < 0 {
				i = len(line)
			}
			if name, rest = line[:i], line[i:]; !want(name) {
				return nil
			}
			if len(rest) > 0 && rest[0] == '{' {
				if _, rest, err = lbl.parse(rest, false); err != nil {
					return &ParseError{Metric: string(name), Err: err}
				}
			}
		}
		v, err := parseValue(rest)
		if err != nil {
			return &ParseError{Metric: string(name), Err: err}
		}
		out[string(name)] += v
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
