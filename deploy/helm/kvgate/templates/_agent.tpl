{{/* The node agent's names and labels (agent-*.yaml). */}}

{{- define "kvgate.agentName" -}}
{{- printf "%s-agent" (include "kvgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvgate.agentSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "kvgate.agentLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvgate.agentSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The picker's telemetry flags: subscribe to the agent pods. */}}
{{- define "kvgate.agentPickerArgs" -}}
{{- if and .Values.agent.enabled .Values.agent.pickerTelemetry }}
- {{ printf "--telemetry-agent-selector=app.kubernetes.io/instance=%s,app.kubernetes.io/component=node-agent" .Release.Name | quote }}
- {{ printf "--telemetry-agent-port=%v" .Values.agent.grpcPort | quote }}
{{- end }}
{{- end }}
