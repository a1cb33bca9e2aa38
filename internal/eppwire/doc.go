// Package eppwire names what crosses the wire between a proxy and the
// Endpoint Picker besides the request itself: the request and response
// headers of Gateway API Inference Extension's EPP protocol, llm-d's
// additions to it, and the envoy.lb dynamic-metadata namespace and keys.
//
// These names are a contract between separately deployed components (the
// picker in extproc/, the local Envoy stand-in in gateway/, a P/D routing
// sidecar reading the prefiller), and a misspelling on one side does not
// fail: the other side simply never sees the header and falls back to
// default routing. Declaring each name once, here, keeps the sides from
// drifting. The x-kvgate-* hint headers of kvgate's wasm filter are not
// here: internal/hints owns them along with their encoding.
package eppwire
