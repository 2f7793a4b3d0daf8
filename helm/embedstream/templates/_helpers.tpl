{{- define "embedstream.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "embedstream.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "embedstream.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "embedstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "embedstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "embedstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "embedstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "embedstream.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* KEDA's name for a SASL mechanism. */}}
{{- define "embedstream.kedaSasl" -}}
{{- $m := .Values.kafka.sasl.mechanism -}}
{{- if eq $m "PLAIN" -}}plaintext{{- else if eq $m "SCRAM-SHA-256" -}}scram_sha256{{- else -}}scram_sha512{{- end -}}
{{- end -}}

{{/* Cross-field checks JSON schema cannot express. */}}
{{- define "embedstream.validate" -}}
{{- if and .Values.keda.enabled (gt (int .Values.keda.maxReplicaCount) (int .Values.keda.partitions)) -}}
{{- fail (printf "keda.maxReplicaCount (%d) exceeds keda.partitions (%d): extra workers would sit idle" (int .Values.keda.maxReplicaCount) (int .Values.keda.partitions)) -}}
{{- end -}}
{{- if and .Values.keda.enabled (gt (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount)) -}}
{{- fail "keda.minReplicaCount must not exceed keda.maxReplicaCount" -}}
{{- end -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int .Values.shutdownGraceSeconds) -}}
{{- fail "terminationGracePeriodSeconds must exceed shutdownGraceSeconds (the worker needs time to drain and commit)" -}}
{{- end -}}
{{- if and .Values.redis.enabled (not (or .Values.redis.url .Values.redis.existingSecret)) -}}
{{- fail "redis.enabled needs redis.url or redis.existingSecret" -}}
{{- end -}}
{{- $sr := .Values.schemaRegistry -}}
{{- if and (eq .Values.records.outputFormat "avro-registry") (not $sr.url) -}}
{{- fail "records.outputFormat avro-registry needs schemaRegistry.url" -}}
{{- end -}}
{{- if and (or $sr.basicAuthKey $sr.bearerTokenKey) (not $sr.existingSecret) -}}
{{- fail "schemaRegistry.basicAuthKey / bearerTokenKey name keys of schemaRegistry.existingSecret: set it" -}}
{{- end -}}
{{- if and $sr.basicAuthKey $sr.bearerTokenKey -}}
{{- fail "schemaRegistry: use basic auth or a bearer token, not both" -}}
{{- end -}}
{{- end -}}
