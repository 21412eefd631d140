{{/* Names and labels. */}}
{{- define "kb.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kb.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kb.labels" -}}
{{ include "kb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Seconds Kubernetes waits before SIGKILL: above the service's own shutdown grace. */}}
{{- define "kb.terminationGrace" -}}
{{- $grace := int .Values.shutdownGraceSecs -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add $grace 15 -}}
{{- else -}}
{{- $t := int .Values.terminationGracePeriodSeconds -}}
{{- if le $t (add $grace 5) -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed shutdownGraceSecs (%d) by more than 5 s: Kubernetes would SIGKILL the pod while it commits and leaves the group" $t $grace) -}}
{{- end -}}
{{- $t -}}
{{- end -}}
{{- end -}}

{{/* One TOML value: strings as basic strings (JSON escapes are TOML's), whole numbers as integers. */}}
{{- define "kb.tomlValue" -}}
{{- if kindIs "string" . -}}
{{- toJson . -}}
{{- else if kindIs "bool" . -}}
{{- ternary "true" "false" . -}}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) -}}
{{- if eq (float64 .) (float64 (int64 .)) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}
{{- fail (printf "a config value must be a string, number or boolean, not %s" (kindOf .)) -}}
{{- end -}}
{{- end -}}
