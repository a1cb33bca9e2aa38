// Package e2e holds the KV data plane's end-to-end test: two `kvgate sim`
// processes, each with its own `kvgate-agent` process, moving real KV
// bytes through NIXL over UCX on loopback (P/D pull, CPU-tier hit, P2P
// pull, a killed agent).
package e2e
