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

{{/* The image: global.imageRegistry (else image.registry) before the repository, then the
digest or the tag. */}}
{{- define "sluice.image" -}}
{{- $registry := (.Values.global).imageRegistry | default .Values.image.registry -}}
{{- $repository := ternary (printf "%s/%s" $registry .Values.image.repository) .Values.image.repository (ne $registry "") -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
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

{{/* SLUICE_PEER_TLS_SAN: cluster.tls.san, else the peer Service's FQDN. */}}
{{- define "sluice.peerTlsSan" -}}
{{- default (printf "%s.%s.svc.%s" (include "sluice.peersServiceName" .) .Release.Namespace .Values.cluster.clusterDomain) .Values.cluster.tls.san }}
{{- end }}

{{/* The Secret holding the peers' certificate: cluster.tls.secretName, else the chart's
Certificate's. */}}
{{- define "sluice.peerTlsSecret" -}}
{{- default (printf "%s-peer-tls" (include "sluice.fullname" .)) .Values.cluster.tls.secretName }}
{{- end }}

{{/* "true" when the peer port speaks mutual TLS. */}}
{{- define "sluice.peerTls" -}}
{{- if and .Values.cluster.enabled .Values.cluster.tls.enabled }}true{{ end }}
{{- end }}

{{/* "true" when Sluice talks to Redis: the Redis backend, or the peer cluster's write-behind. */}}
{{- define "sluice.redisUsed" -}}
{{- if or (eq .Values.backend "redis") (and .Values.cluster.enabled .Values.cluster.writeBehind.enabled) }}true{{ end }}
{{- end }}

{{/* "true" when the Deployment may run more than one pod: replicaCount above 1, or the HPA. */}}
{{- define "sluice.severalPods" -}}
{{- if or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* The claim holding the runtime limits' file: persistence.existingClaim, else the chart's. */}}
{{- define "sluice.runtimeLimitsClaim" -}}
{{- default (printf "%s-runtime-limits" (include "sluice.fullname" .)) .Values.runtimeLimits.persistence.existingClaim }}
{{- end }}

{{/* The probes rendered: the kubelet's gRPC probes cannot speak TLS, so TLS means http. */}}
{{- define "sluice.probesType" -}}
{{- if .Values.grpcTls.enabled }}http{{ else }}{{ .Values.probes.type }}{{ end }}
{{- end }}

{{/* The Secret holding the gRPC client CA: clientCa.secretName, else grpcTls.secretName. */}}
{{- define "sluice.grpcClientCaSecret" -}}
{{- default .Values.grpcTls.secretName .Values.grpcTls.clientCa.secretName }}
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

{{/* Cross-value checks a JSON schema cannot say clearly. They refuse what Sluice's settings
validation (src/settings.rs) would refuse at start-up, so that a bad combination fails
`helm install` instead of crash-looping the pods with exit code 64. */}}
{{- define "sluice.validate" -}}
{{- if and (eq .Values.cluster.mode "lease") (lt (int64 .Values.cluster.lease.durationMs) (mul 2 (int64 .Values.cluster.lease.renewMs))) }}
{{- fail "cluster.lease.durationMs must be at least twice cluster.lease.renewMs (SLUICE_LEASE_DURATION_MS)" }}
{{- end }}
{{- with .Values.cluster.lease.parent }}
{{- if .peers }}
{{- if ne $.Values.cluster.mode "lease" }}
{{- fail "cluster.lease.parent.peers needs cluster.enabled and cluster.mode: lease (SLUICE_LEASE_PARENT)" }}
{{- end }}
{{- if not $.Values.cluster.enabled }}
{{- fail "cluster.lease.parent.peers needs cluster.enabled and cluster.mode: lease (SLUICE_LEASE_PARENT)" }}
{{- end }}
{{- if not .clusterName }}
{{- fail "cluster.lease.parent.peers needs cluster.lease.parent.clusterName: each child cluster needs its own name at the parent (SLUICE_LEASE_CLUSTER_NAME)" }}
{{- end }}
{{- if lt (int64 .renewMs) (int64 $.Values.cluster.lease.renewMs) }}
{{- fail "cluster.lease.parent.renewMs must be at least cluster.lease.renewMs (SLUICE_LEASE_PARENT_RENEW_MS)" }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.rlqs }}
{{- if lt (int64 .abandonIdleSecs) (mul 2 (int64 .assignmentTtlSecs)) }}
{{- fail (printf "rlqs.abandonIdleSecs (%v) must be at least twice rlqs.assignmentTtlSecs (%v) (SLUICE_RLQS_ABANDON_IDLE_SECS)" (int64 .abandonIdleSecs) (int64 .assignmentTtlSecs)) }}
{{- end }}
{{- /* As Sluice parses SLUICE_RLQS_KEY_ORDER: blank is none, else each key trimmed, none empty or repeated. */}}
{{- if trim .keyOrder }}
{{- $seen := list }}
{{- range splitList "," .keyOrder }}
{{- $key := trim . }}
{{- if not $key }}
{{- fail (printf "rlqs.keyOrder %q has an empty key (keys are separated by single commas)" $.Values.rlqs.keyOrder) }}
{{- end }}
{{- if has $key $seen }}
{{- fail (printf "rlqs.keyOrder %q names %q twice (SLUICE_RLQS_KEY_ORDER)" $.Values.rlqs.keyOrder $key) }}
{{- end }}
{{- $seen = append $seen $key }}
{{- end }}
{{- end }}
{{- end }}
{{- $wb := .Values.cluster.writeBehind.enabled }}
{{- if $wb }}
{{- if not .Values.cluster.enabled }}
{{- fail "cluster.writeBehind.enabled needs cluster.enabled: it makes the peer cluster's counters durable" }}
{{- end }}
{{- if ne .Values.cluster.mode "forward" }}
{{- fail "cluster.writeBehind.enabled needs cluster.mode: forward (in divided mode no pod owns a counter, so there is nothing to take over; in lease mode a new owner rebuilds a key from what the pods report holding)" }}
{{- end }}
{{- if ne .Values.backend "memory" }}
{{- fail "cluster.writeBehind.enabled needs backend: memory: the peer cluster counts in memory and Redis (redis.url) keeps only a copy" }}
{{- end }}
{{- if not .Values.redis.url }}
{{- fail "cluster.writeBehind.enabled needs redis.url (REDIS_URL: where the counters are written behind)" }}
{{- end }}
{{- if hasKey .Values.env "REDIS_PERSECOND" }}
{{- fail "cluster.writeBehind.enabled: the write-behind copy goes to redis.url only; remove env.REDIS_PERSECOND" }}
{{- end }}
{{- end }}
{{- if and (eq .Values.backend "redis") (not .Values.redis.url) }}
{{- fail "backend: redis needs redis.url (REDIS_URL: host:port, or comma-separated seeds for redis.type: cluster)" }}
{{- end }}
{{- if eq .Values.backend "memcache" }}
{{- if eq (empty .Values.memcache.hostPort) (empty .Values.memcache.srv) }}
{{- fail "backend: memcache needs exactly one of memcache.hostPort (MEMCACHE_HOST_PORT: host:port,...) and memcache.srv (MEMCACHE_SRV: a DNS SRV name)" }}
{{- end }}
{{- if .Values.cluster.enabled }}
{{- fail "cluster.enabled and backend: memcache are alternatives: memcached already shares the counters between pods" }}
{{- end }}
{{- $t := .Values.memcache.tls }}
{{- if $t.enabled }}
{{- if ne (empty $t.certKey) (empty $t.keyKey) }}
{{- fail "memcache.tls: set certKey and keyKey together (MEMCACHE_TLS_CLIENT_CERT and MEMCACHE_TLS_CLIENT_KEY: both or neither)" }}
{{- end }}
{{- if and (or $t.caKey $t.certKey) (not $t.secretName) }}
{{- fail "memcache.tls.secretName is needed for caKey/certKey/keyKey (set caKey: \"\" to verify memcached with the system's roots)" }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.cluster.enabled (eq .Values.backend "redis") }}
{{- fail "cluster.enabled and backend: redis are alternatives: Redis already shares the counters between pods (to keep the peer cluster and copy its counters to Redis, use backend: memory and cluster.writeBehind)" }}
{{- end }}
{{- if include "sluice.redisUsed" . }}
{{- if and (eq .Values.redis.type "sentinel") (lt (len (splitList "," .Values.redis.url)) 2) }}
{{- fail (printf "redis.type: sentinel needs redis.url as <master name>,<sentinel host:port>,... (got %q)" .Values.redis.url) }}
{{- end }}
{{- if and (ne .Values.redis.type "sentinel") .Values.redis.sentinelAuth.existingSecret }}
{{- fail "redis.sentinelAuth is the sentinels' password: it needs redis.type: sentinel" }}
{{- end }}
{{- if .Values.redis.tls.enabled }}
{{- if hasPrefix "/" .Values.redis.url }}
{{- fail "redis.tls.enabled needs a TCP address in redis.url: Redis serves TLS on TCP only" }}
{{- end }}
{{- $t := .Values.redis.tls }}
{{- if ne (empty $t.certKey) (empty $t.keyKey) }}
{{- fail "redis.tls: set certKey and keyKey together (REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY: both or neither)" }}
{{- end }}
{{- if and (or $t.caKey $t.certKey) (not $t.secretName) }}
{{- fail "redis.tls.secretName is needed for caKey/certKey/keyKey (set caKey: \"\" to verify Redis with the system's roots)" }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.grpcTls.enabled }}
{{- if not .Values.grpcTls.secretName }}
{{- fail "grpcTls.enabled needs grpcTls.secretName (a kubernetes.io/tls Secret: tls.crt, tls.key)" }}
{{- end }}
{{- if and .Values.grpcTls.clientSan (not .Values.grpcTls.clientCa.enabled) }}
{{- fail "grpcTls.clientSan needs grpcTls.clientCa.enabled: client certificates are only asked for with a client CA (GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT)" }}
{{- end }}
{{- else if or .Values.grpcTls.clientCa.enabled .Values.grpcTls.clientSan }}
{{- fail "grpcTls.clientCa and grpcTls.clientSan need grpcTls.enabled" }}
{{- end }}
{{- with .Values.cluster.tls }}
{{- if .enabled }}
{{- if not $.Values.cluster.enabled }}
{{- fail "cluster.tls.enabled needs cluster.enabled: it secures the peer port, which only the peer cluster has (SLUICE_PEER_TLS needs PEERS_DNS)" }}
{{- end }}
{{- if and (not .secretName) (not .certManager.enabled) }}
{{- fail "cluster.tls.enabled needs cluster.tls.secretName (a Secret with tls.crt, tls.key and ca.crt) or cluster.tls.certManager.enabled" }}
{{- end }}
{{- if and .certManager.enabled (not .certManager.issuerRef.name) }}
{{- fail "cluster.tls.certManager.enabled needs cluster.tls.certManager.issuerRef.name (a CA issuer of your own)" }}
{{- end }}
{{- else if or .san .certManager.enabled }}
{{- fail "cluster.tls.san and cluster.tls.certManager need cluster.tls.enabled (SLUICE_PEER_TLS_SAN needs SLUICE_PEER_TLS)" }}
{{- end }}
{{- end }}
{{- if and .Values.tracing.tls.secretName (not (hasPrefix "https://" (lower .Values.tracing.endpoint))) }}
{{- fail (printf "tracing.tls.secretName needs an https:// tracing.endpoint (got %q): Sluice reads the collector's TLS files only for https" .Values.tracing.endpoint) }}
{{- end }}
{{- $managed := list "PORT" "GRPC_PORT" "DEBUG_PORT" "SLUICE_CONFIG" "RUNTIME_ROOT" "CONFIG_TYPE" "BACKEND_TYPE" "REDIS_URL" "REDIS_AUTH" "REDIS_TYPE" "REDIS_SOCKET_TYPE" "PEERS" "PEERS_DNS" "PEER_PORT" "PEER_ADVERTISE_ADDRESS" "SLUICE_SHUTDOWN_DELAY_SECS" "SLUICE_DRAIN_TIMEOUT_SECS" }}
{{- $managed = concat $managed (list "GRPC_SERVER_USE_TLS" "GRPC_SERVER_TLS_CERT" "GRPC_SERVER_TLS_KEY" "GRPC_CLIENT_TLS_CACERT" "GRPC_CLIENT_TLS_SAN" "REDIS_TLS" "REDIS_TLS_CACERT" "REDIS_TLS_CLIENT_CERT" "REDIS_TLS_CLIENT_KEY" "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION" "REDIS_SENTINEL_AUTH" "TRACING_ENABLED" "TRACING_EXPORTER_PROTOCOL" "TRACING_SAMPLING_RATE" "TRACING_SERVICE_NAME" "OTEL_EXPORTER_OTLP_ENDPOINT" "OTEL_EXPORTER_OTLP_HEADERS" "OTEL_METRICS_EXPORTER" "OTEL_METRIC_EXPORT_INTERVAL" "OTEL_EXPORTER_OTLP_CERTIFICATE" "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE" "OTEL_EXPORTER_OTLP_CLIENT_KEY" "SLUICE_PEER_WRITE_BEHIND" "SLUICE_PEER_WRITE_BEHIND_MS" "SLUICE_PEER_TLS" "SLUICE_PEER_TLS_CERT" "SLUICE_PEER_TLS_KEY" "SLUICE_PEER_TLS_CACERT" "SLUICE_PEER_TLS_SAN" "SLUICE_MAX_COUNTERS" "SLUICE_MAX_COUNTER_BYTES" "SLUICE_MAX_CONNECTIONS" "SLUICE_MAX_INFLIGHT_REQUESTS" "SLUICE_MAX_PENDING_REQUEST_BYTES" "SLUICE_REQUEST_TIMEOUT_MS" "SLUICE_IDLE_TIMEOUT_SECS" "SLUICE_RLQS_ASSIGNMENT_TTL_SECS" "SLUICE_RLQS_ABANDON_IDLE_SECS" "SLUICE_RLQS_MAX_BYTES" "SLUICE_RLQS_KEY_ORDER") }}
{{- $managed = concat $managed (list "SLUICE_ADMIN_TOKEN_FILE" "SLUICE_RUNTIME_LIMITS_PATH") }}
{{- $managed = concat $managed (list "MEMCACHE_HOST_PORT" "MEMCACHE_SRV" "MEMCACHE_SRV_REFRESH" "MEMCACHE_MAX_IDLE_CONNS" "SLUICE_MEMCACHE_TIMEOUT_MS" "SLUICE_MEMCACHE_MAX_PENDING" "MEMCACHE_TLS" "MEMCACHE_TLS_CACERT" "MEMCACHE_TLS_CLIENT_CERT" "MEMCACHE_TLS_CLIENT_KEY" "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION") }}
{{- range $name, $_ := .Values.env }}
{{- if has $name $managed }}
{{- fail (printf "env.%s is set by the chart from its values (see values.yaml); set those instead" $name) }}
{{- end }}
{{- end }}
{{- /* One file, one writer: Sluice rewrites SLUICE_RUNTIME_LIMITS_PATH whole, so a second pod on the
same claim would replace the first one's limits with its own. */}}
{{- if .Values.runtimeLimits.persistence.enabled }}
{{- if include "sluice.severalPods" . }}
{{- $pods := ternary "autoscaling.enabled may run several pods" (printf "replicaCount is %d" (int .Values.replicaCount)) (eq .Values.autoscaling.enabled true) }}
{{- fail (printf "runtimeLimits.persistence.enabled keeps one pod's runtime limits in one file on one claim, but %s: a ReadWriteOnce claim cannot be mounted by pods on other nodes, and pods sharing one file would overwrite one another's limits. For several pods keep runtime limits in Redis (backend: redis) or replicate them between peers (cluster.enabled), without persistence" $pods) }}
{{- end }}
{{- if eq .Values.backend "redis" }}
{{- fail "runtimeLimits.persistence.enabled with backend: redis: runtime limits live in Redis, where every pod sees them, and need no volume" }}
{{- end }}
{{- if ne .Values.updateStrategy.type "Recreate" }}
{{- fail "runtimeLimits.persistence.enabled needs updateStrategy.type: Recreate: in a rolling update the new pod mounts the claim while the old one still writes the file (and a ReadWriteOnce claim never mounts on another node, so the rollout stalls)" }}
{{- end }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "invalid" .Values.podDisruptionBudget.minAvailable)) (not (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable)) }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both (set the other to null)" }}
{{- end }}
{{- end }}
