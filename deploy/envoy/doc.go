// Package envoyconfig holds kvgate's Envoy, Envoy Gateway and Istio
// configuration (YAML beside this file); its tests check the Envoy
// bootstraps against go-control-plane's schema and validation rules.
package envoyconfig
