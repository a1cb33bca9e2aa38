// Package proc supervises the child processes of `kvgate up`: each child
// runs in the caller's process group with a parent-death signal, so neither
// Ctrl-C nor a crash of the supervisor leaves one behind; its output goes
// to a log file and a small in-memory tail, so that a child that dies can
// be reported with its last lines.
package proc
