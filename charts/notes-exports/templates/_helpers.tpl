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
{{- else if eq .which "database" -}}
DATABASE_URL
{{- else -}}
CELERY_BROKER_URL
{{- end -}}
{{- end -}}

{{/* True ("true") when the chart must create the connection Secret. */}}
{{- define "notes-exports.createSecret" -}}
{{- if or (not .Values.database.existingSecret) (not .Values.broker.existingSecret) -}}
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
{{- end -}}

{{/* Checksums of the chart's configuration, so a change rolls every pod. */}}
{{- define "notes-exports.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end -}}
