package async

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"time"
)

// Config is llm-d-async's redis-sortedset transport configuration (the
// --transport-config JSON document), with its defaults.
type Config struct {
	URL             string        `json:"url,omitempty"`
	ResultQueueName string        `json:"result_queue_name,omitempty"`
	RetryQueueName  string        `json:"retry_queue_name,omitempty"`
	PollIntervalMs  int           `json:"poll_interval_ms,omitempty"`
	BatchSize       int           `json:"batch_size,omitempty"`
	EnableTracing   bool          `json:"enable_tracing,omitempty"`
	Queues          []QueueConfig `json:"queues"`
}

// QueueConfig is one request sorted set and where its messages go.
type QueueConfig struct {
	ID                 string            `json:"id,omitempty"`
	QueueName          string            `json:"queue_name,omitempty"`
	ResultQueueName    string            `json:"result_queue_name,omitempty"`
	WorkerPoolID       string            `json:"worker_pool_id,omitempty"`
	InferenceObjective string            `json:"inference_objective,omitempty"`
	RequestPathURL     string            `json:"request_path_url,omitempty"`
	IGWBaseURL         string            `json:"igw_base_url,omitempty"`
	GateType           string            `json:"gate_type,omitempty"`
	GateParams         map[string]any    `json:"gate_params,omitempty"`
	Labels             map[string]string `json:"labels,omitempty"`
}

// llm-d-async's defaults.
const (
	DefaultRequestQueue = "request-sortedset"
	DefaultResultQueue  = "result-list"
	DefaultRetryQueue   = "retry-sortedset"
	DefaultPollInterval = time.Second
	DefaultBatchSize    = 10
	DefaultRequestPath  = "/v1/completions"
	DefaultWorkerPool   = "default"
	// MaxQueues bounds the queues one processor polls.
	MaxQueues = 256
)

// Headers the processor sets on dispatched requests (llm-d-async's).
const (
	HeaderInferenceObjective = "x-gateway-inference-objective"
	HeaderFairnessID         = "x-llm-d-inference-fairness-id"
	// FairnessAttribute is the metadata key whose value becomes the
	// fairness id (llm-d-async's random-robin default).
	FairnessAttribute = "userid"
)

// ParseConfig reads a transport configuration: unknown fields are
// refused, defaults applied (redisURL, e.g. $REDIS_URL, fills an empty url),
// and every value checked.
func ParseConfig(data []byte, redisURL string) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("transport config: %w", err)
	}
	if dec.More() {
		return c, fmt.Errorf("transport config: trailing data after the JSON object")
	}
	if c.URL == "" {
		c.URL = redisURL
	}
	c.applyDefaults()
	return c, c.Validate()
}

func (c *Config) applyDefaults() {
	if c.ResultQueueName == "" {
		c.ResultQueueName = DefaultResultQueue
	}
	if c.RetryQueueName == "" {
		c.RetryQueueName = DefaultRetryQueue
	}
	if c.PollIntervalMs == 0 {
		c.PollIntervalMs = int(DefaultPollInterval / time.Millisecond)
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	for i := range c.Queues {
		q := &c.Queues[i]
		if q.RequestPathURL == "" {
			q.RequestPathURL = DefaultRequestPath
		}
		if q.WorkerPoolID == "" {
			q.WorkerPoolID = DefaultWorkerPool
		}
		if q.ID == "" {
			q.ID = q.QueueName
		}
	}
}

// Validate reports the first unusable value.
func (c Config) Validate() error {
	switch {
	case c.URL == "":
		return fmt.Errorf("transport config: url is required (or set REDIS_URL)")
	case c.EnableTracing:
		return fmt.Errorf("transport config: enable_tracing (per-command Redis spans) is not supported by kvgate async")
	case c.PollIntervalMs < 1:
		return fmt.Errorf("transport config: poll_interval_ms must be positive, got %d", c.PollIntervalMs)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("transport config: batch_size must be 1..10000, got %d", c.BatchSize)
	case len(c.Queues) == 0:
		return fmt.Errorf("transport config: at least one queue must be configured")
	case len(c.Queues) > MaxQueues:
		return fmt.Errorf("transport config: %d queues (max %d)", len(c.Queues), MaxQueues)
	}
	if _, err := redisOptions(c.URL); err != nil {
		return fmt.Errorf("transport config: url: %w", err)
	}
	ids, names := map[string]bool{}, map[string]bool{}
	for _, q := range c.Queues {
		switch {
		case q.QueueName == "":
			return fmt.Errorf("transport config: queue_name is required for each queue")
		case ids[q.ID]:
			return fmt.Errorf("transport config: duplicate queue id %q", q.ID)
		case names[q.QueueName]:
			return fmt.Errorf("transport config: duplicate queue_name %q", q.QueueName)
		case q.IGWBaseURL == "":
			return fmt.Errorf("transport config: queue %q: igw_base_url must be specified", q.QueueName)
		case q.WorkerPoolID != DefaultWorkerPool:
			return fmt.Errorf("transport config: queue %q: worker_pool_id %q: kvgate async runs one worker pool, %q (--pool-config-file is not supported)", q.QueueName, q.WorkerPoolID, DefaultWorkerPool)
		case q.QueueName == c.RetryQueueName:
			return fmt.Errorf("transport config: queue %q is also the retry_queue_name", q.QueueName)
		}
		ids[q.ID], names[q.QueueName] = true, true
		u, err := url.Parse(q.IGWBaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("transport config: queue %q: igw_base_url %q is not an http(s) URL", q.QueueName, q.IGWBaseURL)
		}
	}
	return nil
}

// PollInterval is poll_interval_ms as a duration.
func (c Config) PollInterval() time.Duration {
	return time.Duration(c.PollIntervalMs) * time.Millisecond
}
