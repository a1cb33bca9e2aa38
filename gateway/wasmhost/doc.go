// Package wasmhost runs proxy-wasm HTTP filters (ABI 0.2.x, as built by
// proxy-wasm-go-sdk) on wazero, the way Envoy runs them on V8: one module
// instance (VM) per worker, each with one root context configured once, and
// one HTTP context per request.
//
// Only the request side of the ABI is implemented: request header and
// body callbacks, header map get/replace/remove/add/pairs, body buffer
// reads, properties, local responses, logging and the context lifecycle.
// That is what kvgate's filter needs; a module importing anything else is
// rejected when the Host is created, not at request time.
//
// Ownership: a Host owns the compiled module and a bounded pool of VMs.
// A VM belongs to exactly one goroutine between Acquire and Release, so
// nothing inside a VM is locked.
package wasmhost
