// Package bytebudget is a process-wide byte budget for request bodies held
// in memory, in the spirit of Envoy's overload manager: every holder
// reserves what it buffers before it buffers it, and once the budget is
// spent new reservations fail, so the caller refuses the request (503)
// instead of growing its heap. The gateway, the picker and the sidecar each
// own one (the sidecar a second for the bodies it keeps to replay).
package bytebudget
