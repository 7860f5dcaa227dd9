{{/* The chart's name, overridable. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the prefix of every object. Short enough for a "-peers" suffix. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The ConfigMap mounted at /etc/sluice/config. */}}
{{- define "sluice.configMapName" -}}
{{- default (printf "%s-config" (include "sluice.fullname" .)) .Values.config.existingConfigMap }}
{{- end }}

{{/* The headless Service that PEERS_DNS resolves. */}}
{{- define "sluice.peersServiceName" -}}
{{- printf "%s-peers" (include "sluice.fullname" .) }}
{{- end }}

{{/* The Secret holding REDIS_AUTH, or "" when there is none. */}}
{{- define "sluice.redisSecretName" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecret }}
{{- else if .Values.redis.auth.password }}
{{- printf "%s-redis" (include "sluice.fullname" .) }}
{{- end }}
{{- end }}

{{/* Seconds the pod gets after SIGTERM: the health-failing delay, the drain, and a margin. */}}
{{- define "sluice.terminationGracePeriodSeconds" -}}
{{- $needed := add .Values.shutdown.delaySeconds .Values.shutdown.drainTimeoutSeconds }}
{{- if .Values.shutdown.terminationGracePeriodSeconds }}
{{- if le (int .Values.shutdown.terminationGracePeriodSeconds) (int $needed) }}
{{- fail (printf "shutdown.terminationGracePeriodSeconds (%v) must exceed shutdown.delaySeconds + shutdown.drainTimeoutSeconds (%v), or the kubelet kills Sluice mid-drain" .Values.shutdown.terminationGracePeriodSeconds $needed) }}
{{- end }}
{{- .Values.shutdown.terminationGracePeriodSeconds }}
{{- else }}
{{- add $needed 5 }}
{{- end }}
{{- end }}

{{/* Cross-value checks a JSON schema cannot say clearly. */}}
{{- define "sluice.validate" -}}
{{- if and (eq .Values.backend "redis") (not .Values.redis.url) }}
{{- fail "backend: redis needs redis.url (REDIS_URL: host:port, or comma-separated seeds for redis.type: cluster)" }}
{{- end }}
{{- if and .Values.cluster.enabled (eq .Values.backend "redis") }}
{{- fail "cluster.enabled and backend: redis are alternatives: Redis already shares the counters between pods" }}
{{- end }}
{{- $managed := list "PORT" "GRPC_PORT" "DEBUG_PORT" "SLUICE_CONFIG" "RUNTIME_ROOT" "CONFIG_TYPE" "BACKEND_TYPE" "REDIS_URL" "REDIS_AUTH" "REDIS_TYPE" "REDIS_SOCKET_TYPE" "PEERS" "PEERS_DNS" "PEER_PORT" "PEER_ADVERTISE_ADDRESS" "SLUICE_SHUTDOWN_DELAY_SECS" "SLUICE_DRAIN_TIMEOUT_SECS" }}
{{- range $name, $_ := .Values.env }}
{{- if has $name $managed }}
{{- fail (printf "env.%s is set by the chart from its values (see values.yaml); set those instead" $name) }}
{{- end }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "invalid" .Values.podDisruptionBudget.minAvailable)) (not (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable)) }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both (set the other to null)" }}
{{- end }}
{{- end }}
