// Package k8stest starts a real kube-apiserver and etcd (controller-runtime's
// envtest, with the binaries scripts/envtest.sh builds) with the CRDs
// kvgate's Kubernetes objects need, for tests of discovery and of the Helm
// chart.
//
// Tests skip when the binaries are absent, unless KVGATE_REQUIRE_ENVTEST=1
// makes their absence a failure (as CI sets it after running the script).
package k8stest
