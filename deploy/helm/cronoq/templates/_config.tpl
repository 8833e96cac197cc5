{{/* The server's TOML configuration, shared by every pod (a shard's pods add --shard NAME). */}}
{{- define "cronoq.config" -}}
# Rendered by the cronoq Helm chart; docs/server.md describes every key.
[server]
grpc_addr = {{ printf "%s:%d" .Values.server.listenHost (int .Values.server.grpcPort) | quote }}
http_addr = {{ printf "%s:%d" .Values.server.listenHost (int .Values.server.httpPort) | quote }}
shutdown_grace_s = {{ .Values.server.shutdownGraceSeconds }}
ui = {{ .Values.server.ui }}
{{- if .Values.insecurePeerHttp }}
insecure_peer_http = true
{{- end }}
{{- if .Values.tls.secretName }}

[server.tls]
cert = "{{ include "cronoq.tlsDir" . }}/tls.crt"
key = "{{ include "cronoq.tlsDir" . }}/tls.key"
{{- if .Values.tls.requireClientCerts }}
client_ca = "{{ include "cronoq.tlsDir" . }}/ca.crt"
{{- end }}
{{- if .Values.shards }}

[server.peer_tls]
ca = "{{ include "cronoq.tlsDir" . }}/ca.crt"
{{- end }}
{{- end }}
{{- range $role := list "client" "worker" "metrics" "admin" }}

[[auth.tokens]]
token_env = "CRONOQ_{{ upper $role }}_TOKEN"
role = "{{ $role }}"
name = "{{ $role }}"
{{- end }}

[store]
kind = {{ .Values.store.kind | quote }}
{{- if eq .Values.store.kind "postgres" }}
url_env = "DATABASE_URL"
schema = {{ include "cronoq.pgSchema" . | quote }}
keep_finished_s = {{ int .Values.store.keepFinishedSeconds }}
{{- end }}
{{- $scheme := ternary "https" "http" (not (empty .Values.tls.secretName)) }}
{{- range .Values.shards }}

[[shards]]
name = {{ .name | quote }}
number = {{ int .number }}
pools = [{{ range $i, $pool := .pools }}{{ if $i }}, {{ end }}{{ $pool | quote }}{{ end }}]
endpoint = "{{ $scheme }}://{{ include "cronoq.shardName" (dict "root" $ "shard" .) }}.{{ $.Release.Namespace }}.svc.{{ $.Values.clusterDomain }}:{{ $.Values.server.grpcPort }}"
{{- end }}
{{- with .Values.config }}

{{ . }}
{{- end }}
{{- end -}}
