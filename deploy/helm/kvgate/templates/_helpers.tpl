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

{{/* The picker's Deployment, Service and EndpointPickerRef name. */}}
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

{{- define "kvgate.configMapName" -}}
{{- default (printf "%s-config" (include "kvgate.eppName" .)) .Values.picker.existingConfigMap }}
{{- end }}

{{/* The picker's EndpointPickerConfig document. */}}
{{- define "kvgate.configText" -}}
{{- if .Values.picker.configText }}
{{- .Values.picker.configText }}
{{- else }}
{{- toYaml .Values.picker.config }}
{{- end }}
{{- end }}

{{/* The gateway-side namespace for the Istio objects. */}}
{{- define "kvgate.istioNamespace" -}}
{{- default .Release.Namespace .Values.istio.namespace }}
{{- end }}

{{/* Fails rendering on values the API server would accept but that break routing. */}}
{{- define "kvgate.validate" -}}
{{- $ports := .Values.inferencePool.targetPorts | default list }}
{{- if or (lt (len $ports) 1) (gt (len $ports) 8) }}
{{- fail "inferencePool.targetPorts must list 1 to 8 ports" }}
{{- end }}
{{- if not .Values.inferencePool.selector.matchLabels }}
{{- fail "inferencePool.selector.matchLabels must not be empty: it would select every pod" }}
{{- end }}
{{- if not (has .Values.inferencePool.failureMode (list "FailOpen" "FailClose")) }}
{{- fail "inferencePool.failureMode must be FailOpen or FailClose" }}
{{- end }}
{{- if not (has .Values.wasmFilter.type (list "Image" "HTTP")) }}
{{- fail "wasmFilter.type must be Image or HTTP" }}
{{- end }}
{{- if and (eq .Values.wasmFilter.type "HTTP") (not .Values.wasmFilter.sha256) }}
{{- fail "wasmFilter.sha256 is required when wasmFilter.type is HTTP" }}
{{- end }}
{{- end }}
