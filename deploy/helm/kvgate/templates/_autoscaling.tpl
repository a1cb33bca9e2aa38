{{/*
Autoscaling helpers. The defaults are llm-d's workload-autoscaling guides'
(keda-epp overlays queue, saturation and queue-guard; keda-epp-token-aware;
README.slo-aware.md), which autoscale.NewPolicy mirrors for the benchmark.
*/}}

{{/* The label selector of the picker's series. */}}
{{- define "kvgate.autoscaling.epp" -}}
{{- $a := .Values.autoscaling -}}
namespace="{{ .Release.Namespace }}",service="{{ default (include "kvgate.eppName" .) $a.eppService }}"
{{- end }}

{{- define "kvgate.autoscaling.pool" -}}
{{- default (include "kvgate.poolName" .) .Values.autoscaling.inferencePool }}
{{- end }}

{{/* The guides' HPA behaviour per policy, as YAML. */}}
{{- define "kvgate.autoscaling.behavior" -}}
{{- if eq . "slo" }}
scaleUp:
  stabilizationWindowSeconds: 30
  selectPolicy: Max
  policies:
    - type: Percent
      value: 100
      periodSeconds: 60
    - type: Pods
      value: 4
      periodSeconds: 60
scaleDown:
  stabilizationWindowSeconds: 180
  policies:
    - type: Pods
      value: 1
      periodSeconds: 120
{{- else if eq . "token-aware" }}
scaleUp:
  stabilizationWindowSeconds: 0
  policies:
    - type: Pods
      value: 1
      periodSeconds: 180
scaleDown:
  stabilizationWindowSeconds: 300
  policies:
    - type: Pods
      value: 1
      periodSeconds: 300
{{- else }}
scaleUp:
  stabilizationWindowSeconds: {{ ternary 0 300 (eq . "queue-guard") }}
  policies:
    - type: Percent
      value: 100
      periodSeconds: 15
scaleDown:
  stabilizationWindowSeconds: 300
  policies:
    - type: Percent
      value: 100
      periodSeconds: 15
{{- end }}
{{- end }}

{{/* Whether any target needs the SLO-saturation recording rules. */}}
{{- define "kvgate.autoscaling.needsRules" -}}
{{- range .Values.autoscaling.targets }}{{ if eq .policy "slo" }}true{{ end }}{{ end }}
{{- end }}
