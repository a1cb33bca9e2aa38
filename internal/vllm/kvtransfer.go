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
	// RemoteDecoder and RemotePrefiller are OffloadingConnector P/D (the
	// sidecar's offloading connector): the prefill leg keeps its KV in its
	// p2p tier under kv_request_id, the decode leg pulls it from there.
	RemoteDecoder   *RemoteDecoder  `json:"remote_decoder,omitempty"`
	RemotePrefiller *RemoteKVSource `json:"remote_prefiller,omitempty"`
}

// RemoteDecoder is kv_transfer_params.remote_decoder.
type RemoteDecoder struct {
	KVRequestID string `json:"kv_request_id"`
}

// RemoteKVSource is kv_transfer_params.remote_kv_source.
type RemoteKVSource struct {
	KVRequestID string `json:"kv_request_id,omitempty"`
	RemoteHost  string `json:"remote_host"`
	RemotePort  int    `json:"remote_port"`
}
