// Package redistest starts a real redis-server (Debian's package) on
// loopback for one test and stops it when the test ends. Tests of kvgate's
// Redis modes use it rather than an in-process fake, so that they exercise
// the server's own semantics (MULTI/EXEC, Lua, blocking pops, persistence).
package redistest
