package engine

import "errors"

// Errors returned by Add and the other request methods. Callers branch on
// them with errors.Is to pick an HTTP status.
var (
	// ErrQueueFull: the waiting queue is at MaxWaiting (HTTP 429).
	ErrQueueFull = errors.New("engine: waiting queue full")
	// ErrInvalidRequest: empty prompt, non-positive max tokens or a
	// missing id (HTTP 400).
	ErrInvalidRequest = errors.New("engine: invalid request")
	// ErrTooLong: prompt plus max tokens exceed the context the engine can
	// hold (HTTP 400, as vLLM answers).
	ErrTooLong = errors.New("engine: request exceeds the maximum context length")
	// ErrDuplicateID: a request with this id is still known to the engine.
	ErrDuplicateID = errors.New("engine: duplicate request id")
	// ErrLoRADisabled: the request names an adapter but MaxLoRAs is 0.
	ErrLoRADisabled = errors.New("engine: LoRA adapters are disabled")
	// ErrUnknownRequest: Abort or Release named a request the engine does
	// not hold.
	ErrUnknownRequest = errors.New("engine: unknown request")
	// ErrCacheInUse: the prefix cache cannot be reset while requests hold
	// blocks.
	ErrCacheInUse = errors.New("engine: KV cache in use")
	// ErrConfig: the configuration cannot run.
	ErrConfig = errors.New("engine: invalid config")
)
