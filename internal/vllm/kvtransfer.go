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
}
