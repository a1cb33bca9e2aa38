package vllm

// KVTransferParams is the kv_transfer_params object of vLLM's
// NixlConnector (REFERENCE §7), in requests and responses of both P/D legs.
// The pointer fields tell absent from zero: in a response every field is
// present; in a request, absent fields are nil.
type KVTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          *int    `json:"tp_size,omitempty"`
	// RemoteKVSource is a P2P prefix pull (llm-d's sidecar injects it for
	// vLLM's OffloadingConnector p2p tier): the peer whose CPU tier holds
	// the prompt's leading blocks.
	RemoteKVSource *RemoteKVSource `json:"remote_kv_source,omitempty"`
}

// RemoteKVSource is kv_transfer_params.remote_kv_source.
type RemoteKVSource struct {
	KVRequestID string `json:"kv_request_id,omitempty"`
	RemoteHost  string `json:"remote_host"`
	RemotePort  int    `json:"remote_port"`
}
