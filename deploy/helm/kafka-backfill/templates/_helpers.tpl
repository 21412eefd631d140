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

{{/* The container's environment: the pod name, secrets from secretEnv, the admin token, env. */}}
{{- define "kb.env" -}}
# The pod name: the workers' names and, with static membership, group.instance.id.
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: NO_COLOR
  value: "1"
{{- range .Values.secretEnv }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- if .Values.http.admin.enabled }}
# The write endpoint's bearer token (http.admin_token = "${KB_ADMIN_TOKEN}").
- name: KB_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.http.admin.tokenSecret.name }}
      key: {{ .Values.http.admin.tokenSecret.key }}
{{- end }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The write endpoint: on a pod address it needs a token, which only a Secret can give. */}}
{{- define "kb.checkAdmin" -}}
{{- $a := .Values.http.admin -}}
{{- if and $a.enabled (not (and $a.tokenSecret.name $a.tokenSecret.key)) -}}
{{- fail "http.admin.enabled needs http.admin.tokenSecret {name, key}: the write endpoint listens on the pod's address, where the service requires a bearer token (http.admin_token)" -}}
{{- end -}}
{{- end -}}

{{/* The jobs the chart captures: those with a `capture` section, when capture.mode is not "off". */}}
{{- define "kb.checkCapture" -}}
{{- $mode := .Values.capture.mode -}}
{{- $n := 0 -}}
{{- range $job := .Values.jobs -}}
{{- if hasKey $job "capture" -}}
{{- $n = add1 $n -}}
{{- if ne $mode "off" -}}
{{- if ne $job.snapshot.kind "files" -}}
{{- fail (printf "job %s: capture writes snapshot files: snapshot.kind must be \"files\"" $job.name) -}}
{{- end -}}
{{- $dir := toString $job.snapshot.dir -}}
{{- $inKafka := eq (toString (index $job.capture "snapshot_storage" | default "files")) "kafka" -}}
{{- if or (eq $mode "inProcess") $inKafka -}}
{{- if not (hasPrefix "/var/lib/kafka-backfill/" $dir) -}}
{{- fail (printf "job %s: with capture.mode %s%s, snapshot.dir (%s) must be under the data directory /var/lib/kafka-backfill/ (the root filesystem is read-only)" $job.name $mode (ternary " and snapshot_storage kafka" "" $inKafka) $dir) -}}
{{- end -}}
{{- else -}}
{{- $mount := trimSuffix "/" $.Values.capture.snapshotMountPath -}}
{{- if not (hasPrefix (printf "%s/" $mount) $dir) -}}
{{- fail (printf "job %s: with capture.mode separate, snapshot.dir (%s) must be under capture.snapshotMountPath (%s), the volume the capture and the StatefulSet share" $job.name $dir $mount) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (ne $mode "off") (eq $n 0) -}}
{{- fail (printf "capture.mode is %s but no job has a capture section" $mode) -}}
{{- end -}}
{{- if and (eq $mode "inProcess") (gt (int .Values.replicas) 1) -}}
{{- fail "capture.mode inProcess runs the capture in every pod: each would fence the others; use replicas: 1 or capture.mode separate" -}}
{{- end -}}
{{- if and (eq $mode "separate") (include "kb.captureShared" .) (not .Values.capture.snapshotVolume) -}}
{{- fail "capture.mode separate needs capture.snapshotVolume: a volume (ReadWriteMany) the capture writes the snapshot files to and the StatefulSet's pods read; or set snapshot_storage = \"kafka\" in every job's capture section (no shared volume)" -}}
{{- end -}}
{{- end -}}

{{/* "true" when capture.mode is separate and a captured job keeps its snapshots as files only
(snapshot_storage not "kafka"): the capture and the StatefulSet then share capture.snapshotVolume. */}}
{{- define "kb.captureShared" -}}
{{- if eq .Values.capture.mode "separate" -}}
{{- $shared := false -}}
{{- range $job := .Values.jobs -}}
{{- if and (hasKey $job "capture") (ne (toString (index $job.capture "snapshot_storage" | default "files")) "kafka") -}}
{{- $shared = true -}}
{{- end -}}
{{- end -}}
{{- if $shared -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* The capture pods' labels: another name, so the StatefulSet's selector never matches them. */}}
{{- define "kb.captureSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kb.name" . | trunc 55 }}-capture
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
