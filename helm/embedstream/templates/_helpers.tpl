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

{{/* The migration Job's labels: the release's, under a name of its own (the worker's selector labels
     would put its pod behind the PDB and the metrics Service). */}}
{{- define "embedstream.migrationLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "embedstream.name" . }}-migrate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: migration
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
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
{{- if eq $m "PLAIN" -}}plaintext{{- else if eq $m "SCRAM-SHA-256" -}}scram_sha256{{- else if eq $m "OAUTHBEARER" -}}oauthbearer{{- else -}}scram_sha512{{- end -}}
{{- end -}}

{{/* Cross-field checks JSON schema cannot express. */}}
{{- define "embedstream.validate" -}}
{{- if and .Values.keda.enabled .Values.keda.checkCRDs (not (.Capabilities.APIVersions.Has "keda.sh/v1alpha1")) -}}
{{- fail "keda.enabled is true but the cluster serves no keda.sh/v1alpha1 (KEDA's CRDs): install KEDA first (https://keda.sh), or set keda.enabled=false (an HPA on CPU then). Rendering offline with helm template: pass --api-versions keda.sh/v1alpha1, or set keda.checkCRDs=false" -}}
{{- end -}}
{{- $processes := int (include "embedstream.processes" .) -}}
{{- if and (eq (.Values.kafka.groupType | default "consumer") "share") (eq .Values.kafka.delivery "exactly-once") -}}
{{- fail "kafka.groupType=share with kafka.delivery=exactly-once: share groups have no transactions; use at-least-once" -}}
{{- end -}}
{{- if and .Values.keda.enabled (ne (.Values.kafka.groupType | default "consumer") "share") (gt (mul (int .Values.keda.maxReplicaCount) $processes) (int .Values.keda.partitions)) -}}
{{- fail (printf "keda.maxReplicaCount (%d) x %d worker processes a pod exceeds keda.partitions (%d): each process reads partitions of its own, so the extra ones would sit idle; raise the input topic's partitions or lower maxReplicaCount" (int .Values.keda.maxReplicaCount) $processes (int .Values.keda.partitions)) -}}
{{- end -}}
{{- if and .Values.keda.enabled (eq (include "embedstream.shareGroup" .) "true") .Values.kafka.sasl.enabled (eq .Values.kafka.sasl.mechanism "OAUTHBEARER") -}}
{{- fail "kafka.groupType=share with KEDA reads the share group's backlog with SASL PLAIN or SCRAM; OAUTHBEARER is not spoken there: give it a SCRAM user, or set keda.enabled=false (an HPA on CPU then)" -}}
{{- end -}}
{{- if and .Values.keda.enabled (eq (include "embedstream.shareGroup" .) "true") (eq .Values.keda.share.trigger "prometheus") (not .Values.keda.share.prometheus.serverAddress) -}}
{{- fail "keda.share.trigger=prometheus needs keda.share.prometheus.serverAddress (your Prometheus, which must scrape the <release>-backlog Service); or use trigger metrics-api" -}}
{{- end -}}
{{- if and .Values.keda.enabled (gt (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount)) -}}
{{- fail "keda.minReplicaCount must not exceed keda.maxReplicaCount" -}}
{{- end -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int .Values.shutdownGraceSeconds) -}}
{{- fail "terminationGracePeriodSeconds must exceed shutdownGraceSeconds (the worker needs time to drain and commit)" -}}
{{- end -}}
{{- if not (has (.Values.migration.mode | default "job") (list "job" "lane")) -}}
{{- fail (printf "migration.mode=%v: use job (the Job backfills) or lane (the workers backfill beside their live lane)" .Values.migration.mode) -}}
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

{{/* The Kafka client's properties (extra properties, SASL, TLS): the workers', the migration Job's and the
   backlog exporter's. */}}
{{- define "embedstream.kafkaClientEnv" -}}
{{- range $k, $v := .Values.kafka.extraProperties }}
- name: {{ printf "EMBEDSTREAM_KAFKA__%s" ($k | replace "." "_" | upper) }}
  value: {{ include "embedstream.value" $v | quote }}
{{- end }}
{{- if .Values.kafka.sasl.enabled }}
- name: EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL
  value: {{ ternary "SASL_SSL" "SASL_PLAINTEXT" .Values.kafka.tls.enabled | quote }}
- name: EMBEDSTREAM_KAFKA__SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
{{- if eq .Values.kafka.sasl.mechanism "OAUTHBEARER" }}
{{- /* OIDC client credentials: librdkafka fetches and refreshes the token itself */}}
- name: EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_METHOD
  value: "oidc"
- name: EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL
  value: {{ .Values.kafka.sasl.oauthbearer.tokenEndpointUrl | quote }}
{{- with .Values.kafka.sasl.oauthbearer.scope }}
- name: EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_SCOPE
  value: {{ . | quote }}
{{- end }}
- name: EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_CLIENT_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.usernameKey }}
- name: EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_CLIENT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- else }}
- name: EMBEDSTREAM_KAFKA__SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.usernameKey }}
- name: EMBEDSTREAM_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- else if .Values.kafka.tls.enabled }}
- name: EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL
  value: "SSL"
{{- end }}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.existingSecret }}
- name: EMBEDSTREAM_KAFKA__SSL_CA_LOCATION
  value: /etc/embedstream/kafka-tls/{{ .Values.kafka.tls.caKey }}
{{- if .Values.kafka.tls.clientCert }}
{{- /* mutual TLS: the client's certificate and key from the same Secret */}}
- name: EMBEDSTREAM_KAFKA__SSL_CERTIFICATE_LOCATION
  value: /etc/embedstream/kafka-tls/{{ .Values.kafka.tls.certKey }}
- name: EMBEDSTREAM_KAFKA__SSL_KEY_LOCATION
  value: /etc/embedstream/kafka-tls/{{ .Values.kafka.tls.keyKey }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The backlog exporter's environment: only what `embedstream lag` reads (the broker, the group, its input
   topic, the client's properties, the log format). */}}
{{- define "embedstream.backlogEnv" -}}
- name: EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: EMBEDSTREAM_INPUT_TOPIC
  value: {{ .Values.kafka.inputTopic | quote }}
- name: EMBEDSTREAM_GROUP_ID
  value: {{ .Values.kafka.groupId | quote }}
- name: EMBEDSTREAM_GROUP_TYPE
  value: {{ .Values.kafka.groupType | default "consumer" | quote }}
{{ include "embedstream.kafkaClientEnv" . }}
- name: EMBEDSTREAM_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- end -}}

{{/* The worker's environment: the deployment's and the migration Job's. */}}
{{- define "embedstream.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if .Values.kafka.staticMembership }}
- name: EMBEDSTREAM_GROUP_INSTANCE_ID
  value: "$(POD_NAME)"
{{- end }}
- name: EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: EMBEDSTREAM_INPUT_TOPIC
  value: {{ .Values.kafka.inputTopic | quote }}
- name: EMBEDSTREAM_OUTPUT_TOPIC
  value: {{ .Values.kafka.outputTopic | quote }}
- name: EMBEDSTREAM_DLQ_TOPIC
  value: {{ .Values.kafka.dlqTopic | quote }}
- name: EMBEDSTREAM_GROUP_ID
  value: {{ .Values.kafka.groupId | quote }}
- name: EMBEDSTREAM_DELIVERY
  value: {{ .Values.kafka.delivery | quote }}
- name: EMBEDSTREAM_GROUP_PROTOCOL
  value: {{ .Values.kafka.groupProtocol | default "classic" | quote }}
- name: EMBEDSTREAM_GROUP_TYPE
  value: {{ .Values.kafka.groupType | default "consumer" | quote }}
{{- if eq (.Values.kafka.groupType | default "consumer") "share" }}
- name: EMBEDSTREAM_SHARE_MAX_DELIVERIES
  value: {{ include "embedstream.value" (.Values.kafka.shareMaxDeliveries | default 4) | quote }}
{{- else }}
- name: EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS
  value: {{ include "embedstream.value" .Values.kafka.sessionTimeoutMs | quote }}
{{- end }}
{{ include "embedstream.kafkaClientEnv" . }}
{{- with .Values.model.name }}
- name: EMBEDSTREAM_MODEL
  value: {{ . | quote }}
{{- end }}
- name: EMBEDSTREAM_PRECISION
  value: {{ .Values.model.precision | quote }}
{{- if not (kindIs "invalid" .Values.model.documentPrompt) }}
- name: EMBEDSTREAM_DOCUMENT_PROMPT
  value: {{ .Values.model.documentPrompt | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.model.queryPrompt) }}
- name: EMBEDSTREAM_QUERY_PROMPT
  value: {{ .Values.model.queryPrompt | quote }}
{{- end }}
{{- with .Values.model.truncateDim }}
- name: EMBEDSTREAM_TRUNCATE_DIM
  value: {{ include "embedstream.value" . | quote }}
{{- end }}
- name: EMBEDSTREAM_SPARSE
  value: {{ .Values.model.sparse | default "off" | quote }}
{{- if .Values.models.set }}
- name: EMBEDSTREAM_MODELS
  value: /etc/embedstream/models/models.yaml
{{- end }}
{{- with .Values.models.memoryMb }}
- name: EMBEDSTREAM_MODEL_MEMORY_MB
  value: {{ include "embedstream.value" . | quote }}
{{- end }}
- name: EMBEDSTREAM_DEVICE
  value: {{ ternary "cuda" .Values.model.device (and .Values.gpu.enabled (eq .Values.model.device "auto")) | quote }}
- name: EMBEDSTREAM_PROCESSES
  value: {{ include "embedstream.processes" . | quote }}
{{- if and .Values.gpu.enabled (gt (int .Values.gpu.count) 1) }}
{{- /* the pod's GPUs (the device plugin numbers them from 0 in the container): `run --processes` gives
       each process one of them in turn */}}
- name: CUDA_VISIBLE_DEVICES
  value: {{ untilStep 0 (int .Values.gpu.count) 1 | join "," | quote }}
{{- end }}
- name: EMBEDSTREAM_MAX_BATCH_SIZE
  value: {{ include "embedstream.value" (ternary .Values.gpu.maxBatchSize .Values.batching.maxBatchSize (and .Values.gpu.enabled (not (kindIs "invalid" .Values.gpu.maxBatchSize)))) | quote }}
- name: EMBEDSTREAM_MAX_BATCH_TOKENS
  value: {{ include "embedstream.value" (ternary .Values.gpu.maxBatchTokens .Values.batching.maxBatchTokens (and .Values.gpu.enabled (not (kindIs "invalid" .Values.gpu.maxBatchTokens)))) | quote }}
- name: EMBEDSTREAM_MAX_BATCH_WAIT_MS
  value: {{ include "embedstream.value" .Values.batching.maxBatchWaitMs | quote }}
- name: EMBEDSTREAM_MAX_INFLIGHT_BATCHES
  value: {{ include "embedstream.value" .Values.batching.maxInflightBatches | quote }}
- name: EMBEDSTREAM_MAX_TEXT_BYTES
  value: {{ include "embedstream.value" .Values.batching.maxTextBytes | quote }}
- name: EMBEDSTREAM_CHUNKING
  value: {{ .Values.chunking.mode | quote }}
{{- with .Values.chunking.tokens }}
- name: EMBEDSTREAM_CHUNK_TOKENS
  value: {{ include "embedstream.value" . | quote }}
{{- end }}
- name: EMBEDSTREAM_CHUNK_OVERLAP
  value: {{ include "embedstream.value" .Values.chunking.overlap | quote }}
- name: EMBEDSTREAM_MAX_CHUNKS
  value: {{ include "embedstream.value" .Values.chunking.maxChunks | quote }}
{{- with .Values.schemaRegistry }}
{{- if .url }}
- name: EMBEDSTREAM_SCHEMA_REGISTRY_URL
  value: {{ .url | quote }}
{{- if .basicAuthKey }}
- name: EMBEDSTREAM_SCHEMA_REGISTRY__BASIC_AUTH_CREDENTIALS_SOURCE
  value: "USER_INFO"
- name: EMBEDSTREAM_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .basicAuthKey }}
{{- end }}
{{- if .bearerTokenKey }}
- name: EMBEDSTREAM_SCHEMA_REGISTRY__BEARER_AUTH_CREDENTIALS_SOURCE
  value: "STATIC_TOKEN"
- name: EMBEDSTREAM_SCHEMA_REGISTRY__BEARER_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .bearerTokenKey }}
- name: EMBEDSTREAM_SCHEMA_REGISTRY__BEARER_AUTH_LOGICAL_CLUSTER
  value: {{ .bearerLogicalCluster | quote }}
- name: EMBEDSTREAM_SCHEMA_REGISTRY__BEARER_AUTH_IDENTITY_POOL_ID
  value: {{ .bearerIdentityPoolId | quote }}
{{- end }}
{{- if .tls.existingSecret }}
- name: EMBEDSTREAM_SCHEMA_REGISTRY__SSL_CA_LOCATION
  value: /etc/embedstream/registry-tls/{{ .tls.caKey }}
{{- end }}
{{- range $k, $v := .extraProperties }}
- name: {{ printf "EMBEDSTREAM_SCHEMA_REGISTRY__%s" ($k | replace "." "_" | upper) }}
  value: {{ include "embedstream.value" $v | quote }}
{{- end }}
{{- end }}
{{- end }}
- name: EMBEDSTREAM_OUTPUT_FORMAT
  value: {{ .Values.records.outputFormat | quote }}
{{- with .Values.records.keyField }}
- name: EMBEDSTREAM_KEY_FIELD
  value: {{ . | quote }}
{{- end }}
{{- if .Values.redis.enabled }}
- name: EMBEDSTREAM_REDIS_URL
  {{- if .Values.redis.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret }}
      key: {{ .Values.redis.urlKey }}
  {{- else }}
  value: {{ .Values.redis.url | quote }}
  {{- end }}
- name: EMBEDSTREAM_CACHE_TTL_SECONDS
  value: {{ include "embedstream.value" .Values.redis.cacheTtlSeconds | quote }}
- name: EMBEDSTREAM_REDIS_TIMEOUT_MS
  value: {{ include "embedstream.value" .Values.redis.timeoutMs | quote }}
{{- end }}
- name: EMBEDSTREAM_MILVUS_URI
  value: {{ .Values.milvus.uri | quote }}
- name: EMBEDSTREAM_MILVUS_COLLECTION
  value: {{ .Values.milvus.collection | quote }}
{{- if .Values.milvus.alias }}
- name: EMBEDSTREAM_MILVUS_ALIAS
  value: {{ .Values.milvus.alias | quote }}
{{- end }}
- name: EMBEDSTREAM_MILVUS_TIMEOUT_SECONDS
  value: {{ include "embedstream.value" .Values.milvus.timeoutSeconds | quote }}
{{- with .Values.milvus.dbName }}
- name: EMBEDSTREAM_MILVUS_DB_NAME
  value: {{ . | quote }}
{{- end }}
{{- if .Values.milvus.tls.existingSecret }}
- name: EMBEDSTREAM_MILVUS_TLS_CA_FILE
  value: /etc/embedstream/milvus-tls/{{ .Values.milvus.tls.caKey }}
{{- if .Values.milvus.tls.clientCert }}
- name: EMBEDSTREAM_MILVUS_TLS_CERT_FILE
  value: /etc/embedstream/milvus-tls/{{ .Values.milvus.tls.certKey }}
- name: EMBEDSTREAM_MILVUS_TLS_KEY_FILE
  value: /etc/embedstream/milvus-tls/{{ .Values.milvus.tls.keyKey }}
{{- end }}
{{- end }}
{{- if .Values.milvus.tokenSecret.name }}
- name: EMBEDSTREAM_MILVUS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.milvus.tokenSecret.name }}
      key: {{ .Values.milvus.tokenSecret.key }}
{{- end }}
- name: EMBEDSTREAM_METRICS_PORT
  value: {{ include "embedstream.value" .Values.metrics.port | quote }}
- name: EMBEDSTREAM_SHUTDOWN_GRACE_SECONDS
  value: {{ include "embedstream.value" .Values.shutdownGraceSeconds | quote }}
- name: EMBEDSTREAM_HEALTHZ_MAX_TICK_AGE_SECONDS
  value: {{ include "embedstream.value" .Values.healthzMaxTickAgeSeconds | quote }}
- name: EMBEDSTREAM_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: HF_HOME
  value: /tmp/hf
{{- end -}}

{{/* Volumes the worker mounts (and the mounts): the deployment's and the migration Job's. */}}
{{- define "embedstream.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: /etc/embedstream/kafka-tls
  readOnly: true
{{- end }}
{{- if and .Values.schemaRegistry.url .Values.schemaRegistry.tls.existingSecret }}
- name: registry-tls
  mountPath: /etc/embedstream/registry-tls
  readOnly: true
{{- end }}
{{- if .Values.milvus.tls.existingSecret }}
- name: milvus-tls
  mountPath: /etc/embedstream/milvus-tls
  readOnly: true
{{- end }}
{{- if .Values.models.set }}
- name: models
  mountPath: /etc/embedstream/models
  readOnly: true
{{- end }}
{{- if .Values.cache.enabled }}
- name: cache
  mountPath: /opt/cache
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "embedstream.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
{{- end }}
{{- if and .Values.schemaRegistry.url .Values.schemaRegistry.tls.existingSecret }}
- name: registry-tls
  secret:
    secretName: {{ .Values.schemaRegistry.tls.existingSecret }}
{{- end }}
{{- if .Values.milvus.tls.existingSecret }}
- name: milvus-tls
  secret:
    secretName: {{ .Values.milvus.tls.existingSecret }}
{{- end }}
{{- if .Values.models.set }}
- name: models
  configMap:
    name: {{ include "embedstream.fullname" . }}-models
{{- end }}
{{- /* the image's XDG_CACHE_HOME: an int8 export is written there once (the root filesystem is read-only) */}}
{{- if .Values.cache.enabled }}
- name: cache
{{- if .Values.cache.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.cache.existingClaim }}
{{- else }}
  emptyDir:
    {{- with .Values.cache.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
{{- end }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Worker processes in each pod: gpu.workersPerGpu with a GPU, else 1. */}}
{{- define "embedstream.processes" -}}
{{- if .Values.gpu.enabled }}{{ mul (.Values.gpu.workersPerGpu | default 1) (.Values.gpu.count | default 1) }}{{ else }}1{{ end -}}
{{- end }}

{{/* "true" when the workers join a share group (kafka.groupType=share). */}}
{{- define "embedstream.shareGroup" -}}
{{- eq (.Values.kafka.groupType | default "consumer") "share" -}}
{{- end }}

{{/* "true" when the chart runs the backlog exporter (backlog.yaml): a share group's under KEDA, which
     scales on it; a consumer group's where lagExporter.enabled, so the lag alerts have a series while
     no worker runs. */}}
{{- define "embedstream.backlogExporter" -}}
{{- if eq (include "embedstream.shareGroup" .) "true" }}{{ .Values.keda.enabled }}{{ else }}{{ .Values.lagExporter.enabled }}{{ end -}}
{{- end }}

{{/* The exporter's port, interval and resources: keda.share's for a share group, else lagExporter's. */}}
{{- define "embedstream.backlogValues" -}}
{{- if eq (include "embedstream.shareGroup" .) "true" }}{{ toYaml .Values.keda.share }}{{ else }}{{ toYaml .Values.lagExporter }}{{ end -}}
{{- end }}

{{/* The backlog exporter's labels: apart from the workers', so that no worker selector (Service,
     PodDisruptionBudget, ServiceMonitor) picks it. */}}
{{- define "embedstream.backlogSelectorLabels" -}}
app.kubernetes.io/name: {{ include "embedstream.name" . }}-backlog
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "embedstream.backlogLabels" -}}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{ include "embedstream.backlogSelectorLabels" . }}
app.kubernetes.io/component: backlog
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
A value of the chart's values as the worker and KEDA read it: Helm reads every number in values as a
float and writes 1,000,000 and up as 1e+06, which no integer setting parses; a whole number is written
as an integer, anything else as it is.
*/}}
{{- define "embedstream.value" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}{{ int64 . }}{{- else -}}{{ toString . }}{{- end -}}
{{- end -}}

{{/* The migration Job's arguments, as JSON: `migrate --model <model>`, --lane in lane mode, then
   migration.args. */}}
{{- define "embedstream.migrateArgs" -}}
{{- $lane := eq (.Values.migration.mode | default "job") "lane" -}}
{{- concat (list "migrate" "--model" .Values.migration.model) (ternary (list "--lane") (list) $lane) .Values.migration.args | toJson -}}
{{- end -}}

{{/* The backfill lane's settings, on the workers only, in lane mode. */}}
{{- define "embedstream.backfillLaneEnv" -}}
{{- if and .Values.migration.model (eq (.Values.migration.mode | default "job") "lane") }}
- name: EMBEDSTREAM_BACKFILL_MODEL
  value: {{ .Values.migration.model | quote }}
- name: EMBEDSTREAM_BACKFILL_SHARE
  value: {{ .Values.migration.share | default 0.25 | quote }}
{{- include "embedstream.backfillOutputEnv" . }}
{{- end }}
{{- end -}}

{{/* Where a backfill (the Job's or the lane's) publishes its records: nowhere unless asked. */}}
{{- define "embedstream.backfillOutputEnv" -}}
{{- with .Values.migration.outputTopic }}
- name: EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* A GPU pod's requests and limits (less the GPU): gpu.resources where given, else gpu.perProcess
times the pod's processes (embedstream.processes). */}}
{{- define "embedstream.gpuResources" -}}
{{- if .Values.gpu.resources -}}
{{ toYaml .Values.gpu.resources }}
{{- else -}}
{{- $n := include "embedstream.processes" . | atoi -}}
{{- $p := .Values.gpu.perProcess -}}
requests:
  cpu: {{ mulf $p.cpu $n | toString | quote }}
  memory: {{ printf "%dMi" (mul (int $p.memoryMi) $n) }}
limits:
  memory: {{ printf "%dMi" (mul (int $p.memoryLimitMi) $n) }}
{{- end -}}
{{- end -}}

{{/* The pod-level fields of a pod that runs as a worker does, apart from the Deployment's: the
     migration Job's and `helm test`'s pods (placement, security, pull secrets, init containers,
     volumes), so that on a GPU release they run where the workers' GPUs are. */}}
{{- define "embedstream.workerPodFields" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . | quote }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.extraInitContainers }}
initContainers:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  {{- include "embedstream.volumes" . | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A worker-like pod's resources: .res, with one GPU on a GPU release (one process: `migrate`'s
     backfill and shadow check, or `run --check`). Called with (dict "root" $ "res" ...). */}}
{{- define "embedstream.oneGpuResources" -}}
{{- $res := deepCopy .res }}
{{- if .root.Values.gpu.enabled }}
{{- $limits := default dict $res.limits }}
{{- $_ := set $limits .root.Values.gpu.resourceName "1" }}
{{- $_ := set $res "limits" $limits }}
{{- end }}
{{- toYaml $res }}
{{- end -}}
