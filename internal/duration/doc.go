// Package duration owns how kvgate's configuration files write a duration.
//
// Every duration in an EndpointPickerConfig — plugin parameters, the
// saturationDetector and flowControl sections — is decoded here, so one
// spelling means one thing everywhere: a Go duration string ("250ms",
// "5m"), or a number whose unit the field's type says. Duration reads a
// number as seconds (kvgate's own fields and the llm-d fields documented
// as strings); Nanos reads an integer as nanoseconds, which is how
// encoding/json writes a Go time.Duration, for the llm-d fields whose
// upstream type is one, so a config produced by marshalling upstream's
// structs loads unchanged.
package duration
