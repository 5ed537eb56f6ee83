{{/*
OpenTelemetry tracing of every component (values `tracing`): the shared OTEL_* settings go
to the ConfigMap, the per-pod resource attributes and the exporter's headers (from a Secret:
they usually carry a token) to each container's env, and one NetworkPolicy egress rule
opens the collector's port while tracing is on. The processes read the standard variables
(libs/exportcore telemetry.py): OTEL_TRACES_EXPORTER=otlp turns tracing on.
*/}}

{{/* ConfigMap data lines; empty while tracing is off. */}}
{{- define "notes-exports.tracingConfig" -}}
{{- $t := .Values.tracing -}}
{{- if $t.enabled -}}
{{- if not $t.endpoint -}}
{{- fail "tracing.endpoint is required when tracing.enabled is true: the OTLP/HTTP URL of your collector (e.g. http://collector.observability.svc:4318)" -}}
{{- end -}}
OTEL_TRACES_EXPORTER: "otlp"
OTEL_EXPORTER_OTLP_ENDPOINT: {{ $t.endpoint | quote }}
OTEL_EXPORTER_OTLP_PROTOCOL: {{ $t.protocol | quote }}
OTEL_TRACES_SAMPLER: {{ $t.sampler | quote }}
OTEL_TRACES_SAMPLER_ARG: {{ $t.samplerArg | quote }}
{{- end -}}
{{- end -}}

{{/* Container env entries of one component: (dict "root" $ "component" "fast-worker"). */}}
{{- define "notes-exports.tracingEnv" -}}
{{- $root := .root -}}
{{- $t := $root.Values.tracing -}}
{{- if $t.enabled }}
- name: OTEL_K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- $attrs := dict "service.namespace" $root.Release.Namespace "service.version" $root.Chart.AppVersion "k8s.namespace.name" $root.Release.Namespace "k8s.deployment.name" (printf "%s-%s" (include "notes-exports.fullname" $root) .component) -}}
{{- $attrs = merge (deepCopy $t.resourceAttributes) $attrs -}}
{{- $pairs := list -}}
{{- range $k := keys $attrs | sortAlpha -}}
{{- $pairs = append $pairs (printf "%s=%s" $k (get $attrs $k)) -}}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "%s,k8s.pod.name=$(OTEL_K8S_POD_NAME)" (join "," $pairs) | quote }}
{{- with $t.headers.existingSecret }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $t.headers.key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The NetworkPolicy egress rule to the collector; empty while tracing is off. */}}
{{- define "notes-exports.tracingEgress" -}}
{{- $t := .Values.tracing -}}
{{- if and $t.enabled $t.endpoint -}}
{{- $ports := $t.egress.ports -}}
{{- if not $ports -}}
{{- $u := urlParse $t.endpoint -}}
{{- $port := regexFind ":[0-9]+$" $u.host | trimPrefix ":" -}}
{{- if not $port -}}
{{- $port = ternary "443" "80" (eq $u.scheme "https") -}}
{{- end -}}
{{- $ports = list (int $port) -}}
{{- end }}
- ports:
    {{- range $ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with $t.egress.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end -}}
