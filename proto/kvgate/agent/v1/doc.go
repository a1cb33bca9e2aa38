// Package agentv1 is the generated Go code of kvgate's node-agent
// KV-transfer API (kvtransfer.proto; `make proto` regenerates it).
package agentv1
