{{/*
The extension points of one component's pods: (dict "root" $ "key" <components key>) ->
YAML {extraEnv, extraEnvFrom, extraVolumes, extraVolumeMounts, initContainers, sidecars},
each a list.

How a component's list meets the default one (README "Extending the pods"): the entries of
defaults.<field> come first, in their order; an entry of components.<key>.<field> with the
same identity (`name`; `mountPath` for a volume mount) replaces that default entry in place;
the component's other entries follow in their order. extraEnvFrom entries have no identity:
the component's are appended to the defaults'. Each merged list is then rendered through
`tpl` with the chart's root context, so entries may use {{ .Release.Name }} or
{{ include "notes-exports.fullname" . }}. A sidecar or init container without a
securityContext gets the chart's `securityContext` (non-root, read-only root, no
capabilities), so the pod still passes the restricted Pod Security Standard.
*/}}
{{- define "notes-exports.componentExtensions" -}}
{{- $root := .root -}}
{{- $own := default dict (get $root.Values.components .key) -}}
{{- $out := dict -}}
{{- $fields := dict "extraEnv" "name" "extraEnvFrom" "" "extraVolumes" "name" "extraVolumeMounts" "mountPath" "initContainers" "name" "sidecars" "name" -}}
{{- range $field, $by := $fields -}}
{{- $base := default list (get $root.Values.defaults $field) -}}
{{- $over := default list (get $own $field) -}}
{{- $merged := list -}}
{{- if $by -}}
{{- $baseIds := list -}}
{{- range $base -}}
{{- $id := get . $by -}}
{{- $baseIds = append $baseIds $id -}}
{{- $item := . -}}
{{- range $over -}}
{{- if eq (get . $by) $id -}}{{- $item = . -}}{{- end -}}
{{- end -}}
{{- $merged = append $merged $item -}}
{{- end -}}
{{- range $over -}}
{{- if not (has (get . $by) $baseIds) -}}{{- $merged = append $merged . -}}{{- end -}}
{{- end -}}
{{- else -}}
{{- $merged = concat $base $over -}}
{{- end -}}
{{- $rendered := list -}}
{{- if $merged -}}
{{- $rendered = tpl (toYaml $merged) $root | fromYamlArray -}}
{{- end -}}
{{- if has $field (list "initContainers" "sidecars") -}}
{{- $withContext := list -}}
{{- range $rendered -}}
{{- $container := deepCopy . -}}
{{- if not (hasKey $container "securityContext") -}}
{{- $_ := set $container "securityContext" (deepCopy $root.Values.securityContext) -}}
{{- end -}}
{{- $withContext = append $withContext $container -}}
{{- end -}}
{{- $rendered = $withContext -}}
{{- end -}}
{{- $_ := set $out $field $rendered -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
Refuses extension entries that would clash with what the chart itself renders in the
component's pod: (dict "root" $ "key" <components key> "name" <container name> "ext" <the
dict of notes-exports.componentExtensions> "env" <the component's env map>).
*/}}
{{- define "notes-exports.validateExtensions" -}}
{{- range .ext.extraEnv -}}
{{- if hasKey $.env .name -}}
{{- fail (printf "components.%s: %s is set in env and in extraEnv; set it in one of them (env takes name: value, extraEnv takes EnvVar objects such as valueFrom)" $.key .name) -}}
{{- end -}}
{{- end -}}
{{- range concat .ext.initContainers .ext.sidecars -}}
{{- if eq .name $.name -}}
{{- fail (printf "components.%s: a sidecar or init container may not be named %q, the name of the component's own container" $.key .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
