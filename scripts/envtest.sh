#!/usr/bin/env bash
# Provides the binaries controller-runtime's envtest needs (kube-apiserver and
# etcd) in .cache/envtest/bin, using only the Go module proxy and Debian apt.
#
# kube-apiserver is compiled from k8s.io/kubernetes: that module cannot be
# built as a dependency directly because its go.mod points every k8s.io
# staging module at ./staging, which the module zip does not resolve for a
# consumer. A small wrapper module replaces each of those with its published
# release instead. etcd comes from Debian's etcd-server package.
#
# The autoscaling test also runs kube-state-metrics (built from its Go
# module, pinned below) against the envtest API server.
#
# The chart tests also need helm (built from its Go module) and the CRDs of
# the objects the chart can render whose APIs are not part of Kubernetes.
# Those CRDs are taken from the projects' own Go modules, pinned below, and
# copied to .cache/envtest/crds.
#
# Idempotent: a second run with everything in place returns at once.
# Environment:
#   KUBERNETES_VERSION  k8s.io/kubernetes version (default v1.37.2)
#   ENVTEST_DIR         output root (default <repo>/.cache/envtest)
set -euo pipefail

KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.37.2}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
# InferenceObjective left the GIE module after v1.5.0 (it moved to llm-d,
# which the module proxy does not serve); v1.5.0 is its last release there.
GIE_OBJECTIVE_VERSION=v1.5.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0
ENVOY_GATEWAY_VERSION=v1.9.1
ISTIO_API_VERSION=v1.32.0
# KEDA: the ScaledObjects of the chart's autoscaling (llm-d's guides ran 2.20).
KEDA_VERSION=v2.20.2
# kube-state-metrics: the kube_deployment_* series of the chart's
# queue-guard and SLO ScaledObjects, served from the envtest API server.
KUBE_STATE_METRICS_VERSION=v2.18.0
# Staging modules are published as v0.<minor>.<patch> of the same release.
STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
envtest_dir="${ENVTEST_DIR:-${repo_root}/.cache/envtest}"
bin_dir="${envtest_dir}/bin"
src_dir="${envtest_dir}/src"
crd_dir="${envtest_dir}/crds"
stamp="${bin_dir}/.kube-apiserver-version"

mkdir -p "${bin_dir}" "${src_dir}" "${crd_dir}"

log() { printf '[envtest] %s\n' "$*" >&2; }

install_etcd() {
	if [[ -x "${bin_dir}/etcd" ]]; then
		return
	fi
	if ! command -v etcd >/dev/null 2>&1; then
		log "installing Debian etcd-server"
		export DEBIAN_FRONTEND=noninteractive
		# Only refresh the package lists when apt does not know the package yet.
		if ! apt-cache show etcd-server >/dev/null 2>&1; then
			apt-get update -qq
		fi
		apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
	fi
	ln -sf "$(command -v etcd)" "${bin_dir}/etcd"
	log "etcd: $("${bin_dir}/etcd" --version | head -n1)"
}

build_apiserver() {
	if [[ -x "${bin_dir}/kube-apiserver" && -f "${stamp}" && "$(cat "${stamp}")" == "${KUBERNETES_VERSION}" ]]; then
		return
	fi
	local start=${SECONDS}
	log "building kube-apiserver ${KUBERNETES_VERSION} (several minutes on a cold cache)"

	local k8s_mod
	k8s_mod="$(cd "${src_dir}" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
	if [[ -z "${k8s_mod}" || ! -f "${k8s_mod}" ]]; then
		log "could not download k8s.io/kubernetes@${KUBERNETES_VERSION}"
		exit 1
	fi

	# Rewrite every "k8s.io/x => ./staging/src/k8s.io/x" as a replacement by
	# the published staging release; the list comes from kubernetes' own
	# go.mod so it stays right across versions.
	local replaces
	replaces="$(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*$#\1#p' "${k8s_mod}")"
	if [[ -z "${replaces}" ]]; then
		log "no staging replacements found in ${k8s_mod}"
		exit 1
	fi
	{
		echo "module kvgate.local/envtest-apiserver"
		echo
		echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "${k8s_mod}")"
		echo
		echo "replace ("
		while read -r m; do
			printf '\t%s => %s %s\n' "${m}" "${m}" "${STAGING_VERSION}"
		done <<<"${replaces}"
		echo ")"
	} >"${src_dir}/go.mod"
	rm -f "${src_dir}/go.sum"

	(
		cd "${src_dir}"
		export GOFLAGS=-mod=mod
		go get "k8s.io/kubernetes/cmd/kube-apiserver@${KUBERNETES_VERSION}"
		local minor="${KUBERNETES_VERSION#v1.}"
		minor="${minor%%.*}"
		local pkg=k8s.io/component-base/version
		go build -trimpath -o "${bin_dir}/kube-apiserver.tmp" \
			-ldflags "-s -w -X ${pkg}.gitVersion=${KUBERNETES_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}" \
			k8s.io/kubernetes/cmd/kube-apiserver
	)
	mv "${bin_dir}/kube-apiserver.tmp" "${bin_dir}/kube-apiserver"
	echo "${KUBERNETES_VERSION}" >"${stamp}"
	log "kube-apiserver built in $((SECONDS - start)) s"
}

install_helm() {
	local helm_stamp="${bin_dir}/.helm-version"
	if [[ -x "${bin_dir}/helm" && -f "${helm_stamp}" && "$(cat "${helm_stamp}")" == "${HELM_VERSION}" ]]; then
		return
	fi
	local start=${SECONDS}
	log "building helm ${HELM_VERSION}"
	GOBIN="${bin_dir}" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
	echo "${HELM_VERSION}" >"${helm_stamp}"
	log "helm built in $((SECONDS - start)) s"
}

# kube-state-metrics is built from its module in a wrapper module of its
# own (a `go install pkg@version` asks the proxy for the version list,
# which it does not serve for this module; an exact version it does).
install_kube_state_metrics() {
	local ksm_stamp="${bin_dir}/.kube-state-metrics-version"
	if [[ -x "${bin_dir}/kube-state-metrics" && -f "${ksm_stamp}" && "$(cat "${ksm_stamp}")" == "${KUBE_STATE_METRICS_VERSION}" ]]; then
		return
	fi
	local start=${SECONDS} dir="${envtest_dir}/src-kube-state-metrics"
	log "building kube-state-metrics ${KUBE_STATE_METRICS_VERSION}"
	mkdir -p "${dir}"
	printf 'module kvgate.local/envtest-kube-state-metrics\n\ngo 1.26\n' >"${dir}/go.mod"
	rm -f "${dir}/go.sum"
	(
		cd "${dir}"
		export GOFLAGS=-mod=mod
		go get "k8s.io/kube-state-metrics/v2@${KUBE_STATE_METRICS_VERSION}"
		go build -trimpath -ldflags "-s -w" -o "${bin_dir}/kube-state-metrics.tmp" k8s.io/kube-state-metrics/v2
	)
	mv "${bin_dir}/kube-state-metrics.tmp" "${bin_dir}/kube-state-metrics"
	echo "${KUBE_STATE_METRICS_VERSION}" >"${ksm_stamp}"
	log "kube-state-metrics built in $((SECONDS - start)) s"
}

# module_dir prints where the module proxy's copy of module@version lies.
module_dir() {
	(cd "${src_dir}" && go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

# copy_crd copies one file of module@version into the CRD folder.
copy_crd() {
	local module=$1 version=$2 file=$3 out=$4
	if [[ -f "${crd_dir}/${out}" ]]; then
		return
	fi
	local dir
	dir="$(module_dir "${module}" "${version}")"
	if [[ -z "${dir}" || ! -f "${dir}/${file}" ]]; then
		log "${module}@${version} has no ${file}"
		exit 1
	fi
	install -m 0644 "${dir}/${file}" "${crd_dir}/${out}"
	log "CRD ${out} from ${module}@${version}"
}

# llm_d_crd writes GIE's CRD in under llm-d's API group llm-d.ai, where the
# API moved with the picker (llm-d-router config/crd/bases): the same
# v1alpha2 schema, the group renamed. llm-d-router is not on the module
# proxy, so its own file cannot be fetched like the others.
llm_d_crd() {
	local in=$1 out=$2
	if [[ -f "${crd_dir}/${out}" ]]; then
		return
	fi
	sed 's/inference\.networking\.x-k8s\.io/llm-d.ai/g' "${crd_dir}/${in}" >"${crd_dir}/${out}.tmp"
	mv "${crd_dir}/${out}.tmp" "${crd_dir}/${out}"
	log "CRD ${out} (llm-d.ai) from ${in}"
}

fetch_crds() {
	copy_crd sigs.k8s.io/gateway-api-inference-extension "${GIE_OBJECTIVE_VERSION}" \
		config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml inferenceobjectives.yaml
	copy_crd sigs.k8s.io/gateway-api-inference-extension "${GIE_OBJECTIVE_VERSION}" \
		config/crd/bases/inference.networking.x-k8s.io_inferencemodelrewrites.yaml inferencemodelrewrites.yaml
	llm_d_crd inferenceobjectives.yaml llm-d.ai_inferenceobjectives.yaml
	llm_d_crd inferencemodelrewrites.yaml llm-d.ai_inferencemodelrewrites.yaml
	copy_crd github.com/prometheus-operator/prometheus-operator "${PROMETHEUS_OPERATOR_VERSION}" \
		example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml servicemonitors.yaml
	copy_crd github.com/envoyproxy/gateway "${ENVOY_GATEWAY_VERSION}" \
		charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_envoyextensionpolicies.yaml \
		envoyextensionpolicies.yaml
	copy_crd istio.io/api "${ISTIO_API_VERSION}" \
		kubernetes/customresourcedefinitions.gen.yaml istio.yaml
	copy_crd github.com/prometheus-operator/prometheus-operator "${PROMETHEUS_OPERATOR_VERSION}" \
		example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml prometheusrules.yaml
	copy_crd github.com/kedacore/keda/v2 "${KEDA_VERSION}" \
		config/crd/bases/keda.sh_scaledobjects.yaml keda-scaledobjects.yaml
	copy_crd github.com/kedacore/keda/v2 "${KEDA_VERSION}" \
		config/crd/bases/keda.sh_triggerauthentications.yaml keda-triggerauthentications.yaml
}

install_etcd
build_apiserver
install_helm
install_kube_state_metrics
fetch_crds
log "ready: ${bin_dir} (export KUBEBUILDER_ASSETS=${bin_dir}), CRDs in ${crd_dir}"
