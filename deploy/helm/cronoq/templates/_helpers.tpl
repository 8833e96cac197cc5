{{/* The chart's name. */}}
{{- define "cronoq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-cronoq, or <release> when the release name contains the chart's name. */}}
{{- define "cronoq.fullname" -}}
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

{{- define "cronoq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cronoq.labels" -}}
helm.sh/chart: {{ include "cronoq.chart" . }}
{{ include "cronoq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Every server pod of the release, whatever its shard: the main Service selects these. */}}
{{- define "cronoq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronoq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{/* A shard's objects: <fullname>-<shard>. Called with (dict "root" $ "shard" $shard). */}}
{{- define "cronoq.shardName" -}}
{{- printf "%s-%s" (include "cronoq.fullname" .root) .shard.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cronoq.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "cronoq.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "cronoq.dbSecret" -}}
{{- default (printf "%s-db" (include "cronoq.fullname" .)) .Values.store.postgres.urlSecret.name -}}
{{- end -}}

{{- define "cronoq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Where the server's configuration is mounted: the image's CRONOQ_CONFIG is this directory's cronoq.toml. */}}
{{- define "cronoq.configDir" -}}/etc/cronoq{{- end -}}
{{- define "cronoq.tlsDir" -}}/etc/cronoq-tls{{- end -}}

{{/* The PostgreSQL schema: as given, else cronoq, or cronoq_{shard} with shards. */}}
{{- define "cronoq.pgSchema" -}}
{{- if .Values.store.postgres.schema -}}
{{- .Values.store.postgres.schema -}}
{{- else if .Values.shards -}}
cronoq_{shard}
{{- else -}}
cronoq
{{- end -}}
{{- end -}}

{{/* Refuses value sets that would deploy something unsafe or unusable. */}}
{{- define "cronoq.validate" -}}
{{- if and .Values.shards (not .Values.tls.secretName) (not .Values.insecurePeerHttp) -}}
{{- fail "shards forward callers' tokens to each other: set tls.secretName (https:// endpoints, verified with its ca.crt) or insecurePeerHttp: true (plain http:// on a trusted cluster network only)" -}}
{{- end -}}
{{- if and (eq .Values.store.kind "memory") (gt (int .Values.replicas) 1) -}}
{{- fail "store.kind \"memory\" keeps state in one process: set replicas: 1, or use store.kind \"postgres\" for standbys" -}}
{{- end -}}
{{- if and .Values.shards (eq .Values.store.kind "postgres") (not (contains "{shard}" (include "cronoq.pgSchema" .))) -}}
{{- fail "with shards, store.postgres.schema must contain {shard}: each shard keeps its own tables" -}}
{{- end -}}
{{- $names := dict -}}
{{- $numbers := dict -}}
{{- range .Values.shards -}}
{{- if hasKey $names .name -}}{{- fail (printf "shards: the name %q is given twice" .name) -}}{{- end -}}
{{- if hasKey $numbers (toString .number) -}}{{- fail (printf "shards: the number %v is given twice" .number) -}}{{- end -}}
{{- $_ := set $names .name true -}}
{{- $_ := set $numbers (toString .number) true -}}
{{- if and (eq $.Values.store.kind "memory") (gt (int (default $.Values.replicas .replicas)) 1) -}}
{{- fail (printf "shards[%s]: store.kind \"memory\" needs replicas: 1" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
