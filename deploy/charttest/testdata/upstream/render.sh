#!/usr/bin/env bash
# Re-renders the upstream charts' manifests kept here. Needs the two
# repositories checked out at the tags below (GIE_DIR, LLMD_DIR) and helm.
# The files are the charts' output, unedited but for the header.
set -euo pipefail
HELM=${HELM:-helm}
GIE_DIR=${GIE_DIR:?checkout of kubernetes-sigs/gateway-api-inference-extension}
LLMD_DIR=${LLMD_DIR:?checkout of llm-d/llm-d-router}
out=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$GIE_DIR" archive v1.5.0 config/charts | tar -x -C "$work" && mv "$work/config" "$work/gie"
git -C "$LLMD_DIR" archive v0.9.0 config/charts | tar -x -C "$work" && mv "$work/config" "$work/llmd"
(cd "$work/gie/charts/inferencepool" && "$HELM" dependency build . >/dev/null)
(cd "$work/llmd/charts/llm-d-router-gateway" && "$HELM" dependency build . >/dev/null)
render() { # file chart-dir source commit args...
	local file=$1 dir=$2 src=$3 commit=$4
	shift 4
	{
		echo "# Rendered from $src ($commit) with helm $("$HELM" version --short):"
		echo "#   helm template qwen <chart> --namespace llm --kube-version 1.37.2 $*"
		echo "# Unedited chart output; see render.sh."
		(cd "$dir" && "$HELM" template qwen . --namespace llm --kube-version 1.37.2 "$@")
	} >"$out/$file"
}
gie=$(git -C "$GIE_DIR" rev-parse 'v1.5.0^{commit}')
llmd=$(git -C "$LLMD_DIR" rev-parse 'v0.9.0^{commit}')
G="kubernetes-sigs/gateway-api-inference-extension v1.5.0 config/charts/inferencepool"
L="llm-d/llm-d-router v0.9.0 config/charts/llm-d-router-gateway"
render gie-v1.5.0.yaml "$work/gie/charts/inferencepool" "$G" "$gie" \
	--set inferencePool.modelServers.matchLabels.app=vllm-qwen
render gie-v1.5.0-istio.yaml "$work/gie/charts/inferencepool" "$G" "$gie" \
	--set inferencePool.modelServers.matchLabels.app=vllm-qwen --set provider.name=istio
render gie-v1.5.0-ha.yaml "$work/gie/charts/inferencepool" "$G" "$gie" \
	--set inferencePool.modelServers.matchLabels.app=vllm-qwen --set inferenceExtension.replicas=2
render llm-d-router-v0.9.0.yaml "$work/llmd/charts/llm-d-router-gateway" "$L" "$llmd" \
	--set router.modelServers.matchLabels.app=vllm-qwen
render llm-d-router-v0.9.0-ha.yaml "$work/llmd/charts/llm-d-router-gateway" "$L" "$llmd" \
	--set router.modelServers.matchLabels.app=vllm-qwen --set router.epp.replicas=2
