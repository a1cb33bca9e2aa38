// Package charttest tests the Helm chart in deploy/helm/kvgate: it renders
// the documented value sets (ci/*.yaml) with the helm binary that
// scripts/envtest.sh builds, checks what the objects say, and submits them
// to a real kube-apiserver as server-side dry runs against the CRDs of
// every API they use. It holds tests only.
package charttest
