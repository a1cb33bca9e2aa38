package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// task is one valid input line; its body is read back from the input file
// when it is dispatched (off, n: the line's bytes), so a job holds its
// lines' positions, not their bodies.
type task struct {
	line     int // 1-based
	customID string
	model    string
	off, n   int64
}

// maxValidationErrors bounds the errors a failed batch reports.
const maxValidationErrors = 1000

// Validation error codes, in the batch object's errors.data.
const (
	codeEmptyFile      = "empty_file"
	codeTooManyLines   = "too_many_requests"
	codeInvalidJSON    = "invalid_json_line"
	codeMissingParam   = "missing_required_parameter"
	codeInvalidMethod  = "invalid_method"
	codeInvalidURL     = "invalid_url"
	codeDuplicateID    = "duplicate_custom_id"
	codeStreamNotAllow = "invalid_value"
)

// parseInput reads a batch input file. Blank lines are skipped (they keep
// their line numbers). It returns the tasks, or the validation errors that
// fail the batch; err is an I/O error.
func parseInput(r io.Reader, endpoint string, maxLines int) ([]task, []BatchError, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		tasks []task
		errs  []BatchError
		seen  = map[string]int{}
		off   int64
	)
	fail := func(line int, code, param, msg string) {
		if len(errs) < maxValidationErrors {
			e := BatchError{Code: code, Message: msg}
			if line > 0 {
				e.Line = &line
			}
			if param != "" {
				e.Param = strp(param)
			}
			errs = append(errs, e)
		}
	}
	for line := 1; ; line++ {
		raw, err := br.ReadBytes('\n')
		if len(raw) == 0 && errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, err
		}
		start := off
		off += int64(len(raw))
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		if len(tasks)+1 > maxLines {
			fail(0, codeTooManyLines, "", fmt.Sprintf("The input file has more than the %d requests a batch may have.", maxLines))
			return nil, errs, nil
		}
		t, code, param, msg := checkLine(raw, endpoint)
		if code != "" {
			fail(line, code, param, msg)
			continue
		}
		if first, dup := seen[t.customID]; dup {
			fail(line, codeDuplicateID, "custom_id", fmt.Sprintf("The custom_id %q of this request is also the custom_id of line %d; each request in a batch needs its own.", t.customID, first))
			continue
		}
		seen[t.customID] = line
		t.line, t.off, t.n = line, start, int64(len(raw))
		tasks = append(tasks, t)
	}
	if len(tasks) == 0 && len(errs) == 0 {
		fail(0, codeEmptyFile, "", "The input file has no requests.")
	}
	if len(errs) > 0 {
		return nil, errs, nil
	}
	return tasks, nil, nil
}

// checkLine validates one line; code is "" when it is valid.
func checkLine(raw []byte, endpoint string) (t task, code, param, msg string) {
	var in inputLine
	if err := json.Unmarshal(raw, &in); err != nil {
		return t, codeInvalidJSON, "", "This line is not parseable as valid JSON: " + err.Error()
	}
	switch {
	case in.CustomID == "":
		return t, codeMissingParam, "custom_id", "Missing required parameter: 'custom_id'."
	case in.Method == "":
		return t, codeMissingParam, "method", "Missing required parameter: 'method'."
	case in.Method != "POST":
		return t, codeInvalidMethod, "method", fmt.Sprintf("The method %q is not supported; batch requests use POST.", in.Method)
	case in.URL == "":
		return t, codeMissingParam, "url", "Missing required parameter: 'url'."
	case in.URL != endpoint:
		return t, codeInvalidURL, "url", fmt.Sprintf("The url %q of this request does not match the batch's endpoint %q.", in.URL, endpoint)
	case len(in.Body) == 0 || string(in.Body) == "null":
		return t, codeMissingParam, "body", "Missing required parameter: 'body'."
	}
	var body struct {
		Model  *string `json:"model"`
		Stream bool    `json:"stream"`
	}
	if err := json.Unmarshal(in.Body, &body); err != nil {
		return t, codeInvalidJSON, "body", "The body of this request is not a JSON object: " + err.Error()
	}
	if body.Model == nil || *body.Model == "" {
		return t, codeMissingParam, "body.model", "Missing required parameter: 'body.model'."
	}
	if body.Stream {
		return t, codeStreamNotAllow, "body.stream", "Streaming is not supported in a batch: 'body.stream' must be false."
	}
	return task{customID: in.CustomID, model: *body.Model}, "", "", ""
}

// readTask reads a task's body back from the input file.
func readTask(r io.ReaderAt, t task) (json.RawMessage, error) {
	buf := make([]byte, t.n)
	if n, err := r.ReadAt(buf, t.off); n < len(buf) {
		return nil, fmt.Errorf("line %d: %w", t.line, err)
	}
	var in inputLine
	if err := json.Unmarshal(buf, &in); err != nil || in.CustomID != t.customID {
		return nil, fmt.Errorf("line %d changed since validation", t.line)
	}
	return in.Body, nil
}
