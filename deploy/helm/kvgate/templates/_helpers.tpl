{{/* Names and labels shared by every object of the release. */}}

{{- define "kvgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "kvgate.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "kvgate.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
The values in one layout: GIE's (inferenceExtension, inferencePool,
inferenceObjectives) with llm-d-router's (router.*) laid over it. merge keeps
the first map's values, false and 0 included, and fills in the rest.
*/}}
{{- define "kvgate.v" -}}
{{- $r := .Values.router | default dict }}
{{- $epp := merge (deepCopy ($r.epp | default dict)) (deepCopy .Values.inferenceExtension) }}
{{- with $r.monitoring }}{{- $_ := set $epp "monitoring" (merge (deepCopy .) (deepCopy $epp.monitoring)) }}{{- end }}
{{- with $r.tracing }}{{- $_ := set $epp "tracing" (merge (deepCopy .) (deepCopy $epp.tracing)) }}{{- end }}
{{- with $r.latencyPredictor }}{{- $_ := set $epp "latencyPredictor" . }}{{- end }}
{{- if hasKey $r "extraServicePorts" }}{{- $_ := set $epp "extraServicePorts" $r.extraServicePorts }}{{- end }}
{{- $pool := deepCopy .Values.inferencePool }}
{{- with $r.modelServers }}
{{- if hasKey . "matchLabels" }}{{- $_ := set $pool "modelServers" (dict "matchLabels" .matchLabels) }}{{- end }}
{{- if hasKey . "targetPorts" }}{{- $_ := set $pool "targetPorts" .targetPorts }}{{- end }}
{{- if hasKey . "type" }}{{- $_ := set $pool "modelServerType" .type }}{{- end }}
{{- if hasKey . "protocol" }}{{- $_ := set $pool "modelServerProtocol" .protocol }}{{- end }}
{{- end }}
{{- with $r.inferencePool }}
{{- if hasKey . "create" }}{{- $_ := set $pool "create" .create }}{{- end }}
{{- if hasKey . "failureMode" }}{{- $_ := set $epp "failureMode" .failureMode }}{{- end }}
{{- end }}
{{- $objectives := .Values.inferenceObjectives }}
{{- if hasKey $r "inferenceObjectives" }}{{- $objectives = $r.inferenceObjectives }}{{- end }}
{{- dict "epp" $epp "pool" $pool "objectives" $objectives | toJson }}
{{- end }}

{{/* The picker's Deployment, Service, ConfigMap and EndpointPickerRef name. */}}
{{- define "kvgate.eppName" -}}
{{- printf "%s-epp" (include "kvgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvgate.poolName" -}}
{{- default (include "kvgate.fullname" .) .Values.inferencePool.name }}
{{- end }}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvgate.eppName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{- define "kvgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Whether the picker serves TLS: on (as upstream) unless a flag or
kvgate's own plaintext gateway wiring turns it off. */}}
{{- define "kvgate.secureServing" -}}
{{- $v := include "kvgate.v" . | fromJson }}
{{- $flags := $v.epp.flags | default dict }}
{{- if hasKey $flags "secure-serving" }}
{{- ternary "true" "false" (eq (toString (index $flags "secure-serving")) "true") }}
{{- else if or (and .Values.istio.enabled .Values.istio.extProc.enabled) (and .Values.envoyGateway.enabled .Values.envoyGateway.extProc.enabled) }}
{{- "false" }}
{{- else }}
{{- "true" }}
{{- end }}
{{- end }}

{{/* The gateway-side namespace for kvgate's own Istio objects. */}}
{{- define "kvgate.istioNamespace" -}}
{{- default .Release.Namespace .Values.istio.namespace }}
{{- end }}

{{/* Fails rendering on values the chart does not implement, naming them. */}}
{{- define "kvgate.validate" -}}
{{- $v := include "kvgate.v" . | fromJson }}
{{- $ports := $v.pool.targetPorts | default list }}
{{- if or (lt (len $ports) 1) (gt (len $ports) 8) }}
{{- fail "inferencePool.targetPorts must list 1 to 8 ports" }}
{{- end }}
{{- if and $v.pool.create (not (($v.pool.modelServers | default dict).matchLabels)) }}
{{- fail "inferencePool.modelServers.matchLabels is required (an empty selector would select every pod)" }}
{{- end }}
{{- if not (has $v.epp.failureMode (list "FailOpen" "FailClose")) }}
{{- fail "inferenceExtension.failureMode must be FailOpen or FailClose" }}
{{- end }}
{{- if not (has $v.pool.modelServerType (list "vllm" "sglang")) }}
{{- fail (printf "inferencePool.modelServerType %q: kvgate's scraper reads vllm and sglang metrics" $v.pool.modelServerType) }}
{{- end }}
{{- if ne $v.pool.modelServerProtocol "http" }}
{{- fail (printf "inferencePool.modelServerProtocol %q: kvgate parses OpenAI HTTP requests only" $v.pool.modelServerProtocol) }}
{{- end }}
{{- if ne $v.pool.apiVersion "inference.networking.k8s.io/v1" }}
{{- fail (printf "inferencePool.apiVersion %q: kvgate serves inference.networking.k8s.io/v1 pools" $v.pool.apiVersion) }}
{{- end }}
{{- $mds := $v.epp.metricsDataSource | default dict }}
{{- if or (ne ($mds.scheme | default "http") "http") (ne ($mds.path | default "/metrics") "/metrics") }}
{{- fail "inferenceExtension.metricsDataSource: only http and /metrics in the default configuration; configure a metrics-data-source plugin in pluginsCustomConfig" }}
{{- end }}
{{- if ($v.epp.latencyPredictor | default dict).enabled }}
{{- fail "latencyPredictor.enabled: kvgate has no predictor sidecars; its latency model runs in the picker (predicted-latency-producer in pluginsCustomConfig)" }}
{{- end }}
{{- if ($v.epp.sidecar | default dict).enabled }}
{{- fail "inferenceExtension.sidecar.enabled: kvgate's chart runs no sidecar" }}
{{- end }}
{{- $file := $v.epp.pluginsConfigFile }}
{{- if and (ne $file "default-plugins.yaml") (not (hasKey ($v.epp.pluginsCustomConfig | default dict) $file)) }}
{{- fail (printf "inferenceExtension.pluginsConfigFile %q is neither default-plugins.yaml nor a key of pluginsCustomConfig" $file) }}
{{- end }}
{{- if not (has .Values.provider.name (list "none" "istio")) }}
{{- fail (printf "provider.name %q: kvgate's chart renders none or istio (GKE's policies are not rendered)" .Values.provider.name) }}
{{- end }}
{{- if and (eq .Values.provider.name "istio") (eq (include "kvgate.secureServing" .) "false") }}
{{- fail "provider.name=istio dials the picker with TLS: do not turn secure-serving off" }}
{{- end }}
{{- if not (has .Values.wasmFilter.type (list "Image" "HTTP")) }}
{{- fail "wasmFilter.type must be Image or HTTP" }}
{{- end }}
{{- if and (eq .Values.wasmFilter.type "HTTP") (not .Values.wasmFilter.sha256) }}
{{- fail "wasmFilter.sha256 is required when wasmFilter.type is HTTP" }}
{{- end }}
{{- end }}
