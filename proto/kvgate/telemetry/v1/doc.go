// Package telemetryv1 is the generated Go code of kvgate's node-agent
// telemetry API (telemetry.proto; `make proto` regenerates it).
package telemetryv1
