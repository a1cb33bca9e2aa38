package workload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Result is the outcome of one replayed request. Durations are wall time
// measured at the client.
type Result struct {
	Index int `json:"index"`
	// Sent is when the request left, relative to the replay start.
	Sent             time.Duration `json:"sent_ns"`
	TTFT             time.Duration `json:"ttft_ns"`
	Latency          time.Duration `json:"latency_ns"`
	PromptTokens     int           `json:"prompt_tokens"`
	CachedTokens     int           `json:"cached_tokens"`
	CompletionTokens int           `json:"completion_tokens"`
	Status           int           `json:"status"`
	Err              string        `json:"error,omitempty"`
}

// OK reports whether the request completed with a usage record.
func (r Result) OK() bool { return r.Err == "" }

// Target is where a replay sends its requests.
type Target struct {
	// URL is the completions endpoint, e.g. http://127.0.0.1:8080/v1/completions.
	URL    string
	Model  string
	Client *http.Client
	// Header is added to every request (e.g. the InferenceObjective).
	Header http.Header
}

// Replay sends reqs at their arrival times, concurrently, and returns one
// result per request in request order. progress, if set, is called after
// each completion with the number done, from the requests' goroutines;
// it must not block. Replay returns
// early, with the unfinished results marked, when ctx ends.
func Replay(ctx context.Context, t Target, reqs []Request, progress func(done int)) []Result {
	results := make([]Result, len(reqs))
	start := time.Now()
	var wg sync.WaitGroup
	var done atomic.Int64
	for i, r := range reqs {
		if wait := time.Until(start.Add(r.At)); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			for j := i; j < len(reqs); j++ {
				results[j] = Result{Index: j, Err: "not sent: " + context.Cause(ctx).Error()}
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Since(start)
			res := t.Do(ctx, r)
			res.Index, res.Sent = i, sent
			results[i] = res
			if progress != nil {
				progress(int(done.Add(1)))
			}
		}()
	}
	wg.Wait()
	return results
}

// Do sends one streaming completion and measures it.
func (t Target) Do(ctx context.Context, r Request) Result {
	body, err := json.Marshal(map[string]any{
		"model":          t.Model,
		"prompt":         r.Prompt,
		"max_tokens":     r.MaxTokens,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	if err != nil {
		return Result{Err: err.Error()}
	}
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return Result{Err: err.Error()}
	}
	for k, vs := range t.Header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.Client.Do(req)
	if err != nil {
		return Result{Err: err.Error(), Latency: time.Since(start)}
	}
	defer resp.Body.Close()
	res := Result{Status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		res.Latency = time.Since(start)
		return res
	}
	u, err := ReadStream(resp.Body, func() { res.TTFT = time.Since(start) })
	res.Latency = time.Since(start)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.PromptTokens, res.CompletionTokens, res.CachedTokens = u.PromptTokens, u.CompletionTokens, u.PromptTokensDetails.CachedTokens
	return res
}

// Usage is the OpenAI usage record.
type Usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// Stream errors.
var (
	ErrNoUsage   = errors.New("stream ended without a usage record")
	ErrTruncated = errors.New("stream ended without [DONE]")
)

// maxEventBytes bounds one SSE line.
const maxEventBytes = 1 << 20

// ReadStream reads an OpenAI SSE stream to its [DONE], calling first at the
// first data event, and returns the usage record (sent last when
// stream_options.include_usage is set).
func ReadStream(r io.Reader, first func()) (Usage, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxEventBytes)
	var (
		u       Usage
		gotData bool
		gotUse  bool
	)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue // comments, event names, blank separators
		}
		data = bytes.TrimSpace(data)
		if !gotData {
			gotData = true
			if first != nil {
				first()
			}
		}
		if string(data) == "[DONE]" {
			if !gotUse {
				return u, ErrNoUsage
			}
			return u, nil
		}
		var ev struct {
			Usage *Usage `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return u, fmt.Errorf("bad event: %w", err)
		}
		if ev.Error != nil {
			return u, fmt.Errorf("stream error: %s", ev.Error.Message)
		}
		if ev.Usage != nil {
			u, gotUse = *ev.Usage, true
		}
	}
	if err := sc.Err(); err != nil {
		return u, fmt.Errorf("stream: %w", err)
	}
	return u, ErrTruncated
}
