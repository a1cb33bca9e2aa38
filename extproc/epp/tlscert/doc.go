// Package tlscert supplies the picker's serving certificate for
// --secure-serving: a self-signed one made at start when no --cert-path is
// given, as the GIE and llm-d pickers do (gateways dial them with TLS and
// skip verification), or the tls.crt / tls.key pair of a directory,
// re-read when the files change (a rotated Kubernetes Secret).
package tlscert
