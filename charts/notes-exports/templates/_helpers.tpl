{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "notes-exports.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix: <release>-<name>, or the release when it already contains the name. */}}
{{- define "notes-exports.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "notes-exports.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "notes-exports.labels" -}}
helm.sh/chart: {{ include "notes-exports.chart" . }}
{{ include "notes-exports.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: notes-exports
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "notes-exports.selectorLabels" -}}
app.kubernetes.io/name: {{ include "notes-exports.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component: call with (dict "root" $ "component" "fast-worker"). */}}
{{- define "notes-exports.componentLabels" -}}
{{ include "notes-exports.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "notes-exports.componentSelectorLabels" -}}
{{ include "notes-exports.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Kubernetes name of a component key: recoveryScanner -> recovery-scanner. */}}
{{- define "notes-exports.componentName" -}}
{{- kebabcase . -}}
{{- end -}}

{{/* The component's values merged over the shared defaults: (dict "root" $ "key" "api"). */}}
{{- define "notes-exports.componentValues" -}}
{{- $defaults := deepCopy .root.Values.defaults -}}
{{- $own := deepCopy (get .root.Values.components .key) -}}
{{- toYaml (mergeOverwrite $defaults $own) -}}
{{- end -}}

{{- define "notes-exports.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}
{{- end -}}

{{- define "notes-exports.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "notes-exports.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding a connection URL: (dict "root" $ "which" "database"). */}}
{{- define "notes-exports.secretName" -}}
{{- $v := get .root.Values .which -}}
{{- if $v.existingSecret -}}
{{- $v.existingSecret -}}
{{- else -}}
{{- include "notes-exports.fullname" .root -}}
{{- end -}}
{{- end -}}

{{- define "notes-exports.secretKey" -}}
{{- $v := get .root.Values .which -}}
{{- if $v.existingSecret -}}
{{- $v.existingSecretKey -}}
{{- else -}}
{{- get (dict "database" "DATABASE_URL" "broker" "CELERY_BROKER_URL" "rateLimitRedis" "RATE_LIMIT_REDIS_URL") .which -}}
{{- end -}}
{{- end -}}

{{/* True ("true") when the chart must create the connection Secret. */}}
{{- define "notes-exports.createSecret" -}}
{{- $rl := .Values.rateLimitRedis -}}
{{- if or (not .Values.database.existingSecret) (not .Values.broker.existingSecret) (and $rl.url (not $rl.existingSecret)) -}}
true
{{- end -}}
{{- end -}}

{{/* Fail early on connection settings that cannot work. */}}
{{- define "notes-exports.validate" -}}
{{- if and (not .Values.database.existingSecret) (not .Values.database.url) -}}
{{- fail "set database.url or database.existingSecret" -}}
{{- end -}}
{{- if and (not .Values.broker.existingSecret) (not .Values.broker.url) -}}
{{- fail "set broker.url or broker.existingSecret" -}}
{{- end -}}
{{- $db := .Values.database -}}
{{- if and (eq $db.pooler "transaction") (not $db.existingSecret) (not $db.directUrl) -}}
{{- fail "database.pooler transaction needs database.directUrl: the same database without the pooler, for LISTEN and migrations" -}}
{{- end -}}
{{- if and (hasPrefix "sentinel://" (default "" .Values.broker.url)) (not .Values.broker.sentinel.master) -}}
{{- fail "a sentinel:// broker.url needs broker.sentinel.master (the master name the Sentinels monitor)" -}}
{{- end -}}
{{- $a := .Values.artifacts -}}
{{- if and (eq $a.backend "s3") (not $a.s3.bucket) -}}
{{- fail "artifacts.s3.bucket is required when artifacts.backend is s3" -}}
{{- end -}}
{{- if and (eq $a.downloadMode "redirect") (ne $a.backend "s3") -}}
{{- fail "artifacts.downloadMode redirect needs artifacts.backend s3: the file backend cannot presign URLs (the api would stream anyway); set artifacts.downloadMode to stream" -}}
{{- end -}}
{{- if and (eq $a.backend "s3") $a.s3.existingSecret (or (not $a.s3.accessKeyIdKey) (not $a.s3.secretAccessKeyKey)) -}}
{{- fail "artifacts.s3.existingSecret needs artifacts.s3.accessKeyIdKey and artifacts.s3.secretAccessKeyKey" -}}
{{- end -}}
{{- if and (not .Values.image.tag) (not .Values.image.digest) -}}
{{- fail "image.tag (or image.digest) is required: no notes-exports image is published; build one (make image, make kind-load or make minikube-load print its tag) and pass --set image.tag=<tag>" -}}
{{- end -}}
{{- $ing := .Values.ingress -}}
{{- if and $ing.enabled $ing.host (not $ing.tls.enabled) (not $ing.allowInsecureHost) -}}
{{- fail (printf "ingress.host %q is served over plain HTTP (API keys and exports in clear text): enable ingress.tls, or set ingress.allowInsecureHost=true for a local cluster" $ing.host) -}}
{{- end -}}
{{- $route := .Values.httpRoute -}}
{{- if $route.enabled -}}
{{- if not $route.parentRefs -}}
{{- fail "httpRoute.parentRefs is required: the Gateway (and listener) the route attaches to" -}}
{{- end -}}
{{- if and $route.hostnames (not $route.listenerTLS) (not $route.allowInsecureHost) -}}
{{- fail (printf "httpRoute.hostnames %v are served over plain HTTP unless the Gateway listener terminates TLS: attach to an HTTPS listener and set httpRoute.listenerTLS=true, or set httpRoute.allowInsecureHost=true for a local cluster" $route.hostnames) -}}
{{- end -}}
{{- end -}}
{{- if and (not (include "notes-exports.s3" .)) .Values.artifacts.persistence.enabled (has "ReadWriteOncePod" .Values.artifacts.persistence.accessModes) -}}
{{- fail "artifacts.persistence.accessModes ReadWriteOncePod cannot work: the api, the workers and the recovery-scanner all mount the artifact volume; use ReadWriteMany (pods on any node), ReadWriteOnce (one node) or artifacts.backend s3" -}}
{{- end -}}
{{- $tp := .Values.trustedProxies -}}
{{- if and (or .Values.httpRoute.enabled .Values.ingress.enabled) (not $tp.addresses) (not $tp.allowNone) -}}
{{- fail "the api is exposed through an HTTPRoute or an Ingress but trustedProxies.addresses is empty: every client would have the proxy's address (one client's failed console sign-ins would lock every operator out). Set trustedProxies.addresses to the addresses or CIDR of the Gateway's / Ingress controller's pods (e.g. the pod CIDR, [10.244.0.0/16] on kind), or trustedProxies.allowNone=true" -}}
{{- end -}}
{{- range $tp.addresses -}}
{{- if or (eq . "*") (eq . "0.0.0.0/0") (eq . "::/0") -}}
{{- fail (printf "trustedProxies.addresses %q trusts every peer: any client could name any address in X-Forwarded-For; list the proxies' addresses or CIDR" .) -}}
{{- end -}}
{{- end -}}
{{- include "notes-exports.validateBroker" . -}}
{{- $beat := get .Values.components "beat" -}}
{{- if and $beat $beat.enabled (ne (int (default 1 $beat.replicas)) 1) -}}
{{- fail "components.beat.replicas must be 1: two beats would emit every tick twice" -}}
{{- end -}}
{{- end -}}

{{/* "true" when artifacts live in S3 (no volume, no PVC). */}}
{{- define "notes-exports.s3" -}}
{{- if eq .Values.artifacts.backend "s3" -}}
true
{{- end -}}
{{- end -}}

{{/* ARTIFACT_URL of the S3 backend: s3://<bucket>[/<prefix>]. */}}
{{- define "notes-exports.artifactUrl" -}}
{{- $s3 := .Values.artifacts.s3 -}}
{{- $prefix := trimAll "/" $s3.prefix -}}
{{- if $prefix -}}
{{- printf "s3://%s/%s" $s3.bucket $prefix -}}
{{- else -}}
{{- printf "s3://%s" $s3.bucket -}}
{{- end -}}
{{- end -}}

{{/* Egress ports to the object store, a JSON list: networkPolicy.egress.objectStore.ports,
or 443 (AWS S3, and STS for IRSA / web identity) plus the port of artifacts.s3.endpointUrl
(explicit, or 80 / 443 from its scheme). */}}
{{- define "notes-exports.objectStorePorts" -}}
{{- $ports := list -}}
{{- range .Values.networkPolicy.egress.objectStore.ports -}}
{{- $ports = append $ports (int .) -}}
{{- end -}}
{{- if not $ports -}}
{{- $ports = list 443 -}}
{{- with .Values.artifacts.s3.endpointUrl -}}
{{- $u := urlParse . -}}
{{- $port := regexFind ":[0-9]+$" $u.host | trimPrefix ":" -}}
{{- if not $port -}}
{{- $port = ternary "443" "80" (eq $u.scheme "https") -}}
{{- end -}}
{{- $ports = append $ports (int $port) -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $ports) -}}
{{- end -}}

{{/* Environment shared by every container: ConfigMap + connection Secrets. */}}
{{- define "notes-exports.envFrom" -}}
- configMapRef:
    name: {{ include "notes-exports.fullname" . }}
{{- end -}}

{{- define "notes-exports.secretEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "notes-exports.secretName" (dict "root" . "which" "database") }}
      key: {{ include "notes-exports.secretKey" (dict "root" . "which" "database") }}
- name: CELERY_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "notes-exports.secretName" (dict "root" . "which" "broker") }}
      key: {{ include "notes-exports.secretKey" (dict "root" . "which" "broker") }}
{{- if or .Values.rateLimitRedis.url .Values.rateLimitRedis.existingSecret }}
- name: RATE_LIMIT_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "notes-exports.secretName" (dict "root" . "which" "rateLimitRedis") }}
      key: {{ include "notes-exports.secretKey" (dict "root" . "which" "rateLimitRedis") }}
{{- end }}
{{- include "notes-exports.haEnv" . }}
{{- $s3 := .Values.artifacts.s3 }}
{{- if and (include "notes-exports.s3" .) $s3.existingSecret }}
- name: S3_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ $s3.existingSecret }}
      key: {{ $s3.accessKeyIdKey }}
- name: S3_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $s3.existingSecret }}
      key: {{ $s3.secretAccessKeyKey }}
{{- end }}
{{- with .Values.manifestSigning }}
{{- if .existingSecret }}
- name: MANIFEST_SIGNING_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .key }}
{{- end }}
{{- if .previousPublicKeys }}
- name: MANIFEST_PREVIOUS_PUBLIC_KEYS
  value: {{ .previousPublicKeys | quote }}
{{- end }}
{{- end }}
{{- include "notes-exports.webhookSecretEnv" . }}
{{- end -}}

{{/* The failover and pooler settings (docs/operations.md): the pooler mode and its direct
URL, the Sentinel master and password, the broker's CA file. Lines start with a newline. */}}
{{- define "notes-exports.haEnv" -}}
{{- $db := .Values.database }}
{{- $b := .Values.broker }}
{{- if eq $db.pooler "transaction" }}
- name: DATABASE_POOLER
  value: transaction
- name: DATABASE_DIRECT_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "notes-exports.secretName" (dict "root" . "which" "database") }}
      key: {{ ternary $db.existingSecretDirectKey "DATABASE_DIRECT_URL" (ne $db.existingSecret "") }}
{{- end }}
{{- with $b.sentinel.master }}
- name: BROKER_SENTINEL_MASTER
  value: {{ . | quote }}
{{- end }}
{{- if or (and $b.existingSecret $b.sentinel.existingSecretPasswordKey) (and (not $b.existingSecret) $b.sentinel.password) }}
- name: BROKER_SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "notes-exports.secretName" (dict "root" . "which" "broker") }}
      key: {{ ternary $b.sentinel.existingSecretPasswordKey "BROKER_SENTINEL_PASSWORD" (ne $b.existingSecret "") }}
{{- end }}
{{- if $b.tls.caSecret }}
- name: BROKER_TLS_CA_FILE
  value: /etc/notes-exports/broker-ca/{{ $b.tls.caKey }}
{{- end }}
{{- end -}}

{{/* Checksums of the chart's configuration, so a change rolls every pod. */}}
{{- define "notes-exports.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end -}}

{{/* The paths the Ingress and the HTTPRoute route to the api, a JSON list of
{"path", "match"} (match: Exact or Prefix): the public API (/v1/...) and the health checks,
plus the docs, the console and extra prefixes only when the values ask. Never /metrics:
metrics are served on their own port. */}}
{{- define "notes-exports.publicPaths" -}}
{{- $e := .Values.exposure -}}
{{- $paths := list (dict "path" "/v1" "match" "Prefix") (dict "path" "/healthz" "match" "Exact") (dict "path" "/readyz" "match" "Exact") -}}
{{- if $e.docs -}}
{{- $paths = concat $paths (list (dict "path" "/docs" "match" "Prefix") (dict "path" "/redoc" "match" "Exact") (dict "path" "/openapi.json" "match" "Exact")) -}}
{{- end -}}
{{- if $e.console -}}
{{- $paths = append $paths (dict "path" "/console" "match" "Prefix") -}}
{{- end -}}
{{- range $e.extraPathPrefixes -}}
{{- $paths = append $paths (dict "path" . "match" "Prefix") -}}
{{- end -}}
{{- toJson $paths -}}
{{- end -}}

{{/* "true" when every pod that mounts the artifact volume must run on one node: the file
backend on a claim that only one node can mount (ReadWriteOnce). */}}
{{- define "notes-exports.artifactsSameNode" -}}
{{- $p := .Values.artifacts.persistence -}}
{{- if and (not (include "notes-exports.s3" .)) $p.enabled (not (has "ReadWriteMany" $p.accessModes)) -}}
true
{{- end -}}
{{- end -}}

{{/* WEBHOOK_SECRET_KEYS from webhookSecrets.existingSecret (every process and the
migrations Job, which encrypts the secrets of revision 0022). Lines start with a newline. */}}
{{- define "notes-exports.webhookSecretEnv" -}}
{{- with .Values.webhookSecrets }}
{{- if .existingSecret }}
- name: WEBHOOK_SECRET_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* FORWARDED_ALLOW_IPS of the api (gunicorn, passed on to uvicorn's proxy headers
middleware): trustedProxies.addresses, or loopback only (nothing proxies inside the pod). */}}
{{- define "notes-exports.forwardedAllowIps" -}}
{{- if .Values.trustedProxies.addresses -}}
{{- join "," .Values.trustedProxies.addresses -}}
{{- else -}}
127.0.0.1,::1
{{- end -}}
{{- end -}}

{{/* "true" when a Redis URL (redis://, rediss://, or the first of a sentinel:// list, which
carries the credentials) has a password: redis://user:password@host or redis://:password@host. */}}
{{- define "notes-exports.redisUrlHasPassword" -}}
{{- $first := first (splitList ";" .) -}}
{{- $u := urlParse $first -}}
{{- $info := default "" $u.userinfo -}}
{{- if and (contains ":" $info) (ne (last (splitList ":" $info)) "") -}}
true
{{- end -}}
{{- end -}}

{{/* A broker (and a rate-limit Redis) without a password is refused unless the values say
so (allowNoPassword): lesson 08, an authenticated broker everywhere. A URL in an existing
Secret cannot be read at render time: the processes' own check applies there. */}}
{{- define "notes-exports.validateBroker" -}}
{{- $b := .Values.broker -}}
{{- if and $b.url (not $b.existingSecret) (not (include "notes-exports.redisUrlHasPassword" $b.url)) (not $b.allowNoPassword) -}}
{{- fail "broker.url has no password: anyone who reaches the broker's Redis could read, drop or forge export messages. Use an ACL user with a password (redis://exports:PASSWORD@host:6379/0; k8s/dev-deps.yaml shows one), or set broker.allowNoPassword=true for a throwaway cluster" -}}
{{- end -}}
{{- $rl := .Values.rateLimitRedis -}}
{{- if and $rl.url (not $rl.existingSecret) (not (include "notes-exports.redisUrlHasPassword" $rl.url)) (not $rl.allowNoPassword) -}}
{{- fail "rateLimitRedis.url has no password: use an ACL user with a password (redis://ratelimit:PASSWORD@host:6379/0), or set rateLimitRedis.allowNoPassword=true for a throwaway cluster" -}}
{{- end -}}
{{- end -}}
