{{/*
A server Deployment. Called with (dict "root" $ "name" NAME "replicas" N "shard" SHARD-or-nil).
*/}}
{{- define "cronoq.deployment" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $scheme := ternary "HTTPS" "HTTP" (not (empty $v.tls.secretName)) -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "cronoq.labels" $root | nindent 4 }}
    {{- with .shard }}
    cronoq.io/shard: {{ .name }}
    {{- end }}
spec:
  replicas: {{ int .replicas }}
  revisionHistoryLimit: 5
  # Every pod is ready once up (readiness is /healthz): standbys answer
  # UNAVAILABLE, which clients retry, so rolling updates proceed.
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
      maxSurge: 1
  selector:
    matchLabels:
      {{- include "cronoq.selectorLabels" $root | nindent 6 }}
      {{- with .shard }}
      cronoq.io/shard: {{ .name }}
      {{- end }}
  template:
    metadata:
      labels:
        {{- include "cronoq.selectorLabels" $root | nindent 8 }}
        {{- with .shard }}
        cronoq.io/shard: {{ .name }}
        {{- end }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # A changed configuration rolls the pods.
        checksum/config: {{ include "cronoq.config" $root | sha256sum }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ int $v.terminationGracePeriodSeconds }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml $v.podSecurityContext | nindent 8 }}
      containers:
        - name: server
          image: {{ include "cronoq.image" $root }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          {{- with .shard }}
          args: ["--shard", {{ .name | quote }}]
          {{- end }}
          env:
            - name: CRONOQ_LOG_LEVEL
              value: {{ $v.server.logLevel | quote }}
            {{- range $role := list "client" "worker" "metrics" "admin" }}
            - name: CRONOQ_{{ upper $role }}_TOKEN
              valueFrom:
                secretKeyRef:
                  name: {{ include "cronoq.tokensSecret" $root }}
                  key: {{ get $v.auth.keys $role }}
            {{- end }}
            {{- if eq $v.store.kind "postgres" }}
            - name: DATABASE_URL
              valueFrom:
                secretKeyRef:
                  name: {{ include "cronoq.dbSecret" $root }}
                  key: {{ $v.store.postgres.urlSecret.key }}
            {{- end }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: grpc
              containerPort: {{ int $v.server.grpcPort }}
              protocol: TCP
            - name: http
              containerPort: {{ int $v.server.httpPort }}
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: http
              scheme: {{ $scheme }}
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /healthz
              port: http
              scheme: {{ $scheme }}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          securityContext:
            {{- toYaml $v.securityContext | nindent 12 }}
          {{- with $v.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: config
              mountPath: {{ include "cronoq.configDir" $root }}
              readOnly: true
            {{- if $v.tls.secretName }}
            - name: tls
              mountPath: {{ include "cronoq.tlsDir" $root }}
              readOnly: true
            {{- end }}
            # The root filesystem is read-only; this is the only scratch space.
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: config
          configMap:
            name: {{ include "cronoq.fullname" $root }}
        {{- if $v.tls.secretName }}
        - name: tls
          secret:
            secretName: {{ $v.tls.secretName }}
        {{- end }}
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* A PodDisruptionBudget over one Deployment's pods. */}}
{{- define "cronoq.pdb" -}}
{{- $root := .root -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "cronoq.labels" $root | nindent 4 }}
    {{- with .shard }}
    cronoq.io/shard: {{ .name }}
    {{- end }}
spec:
  maxUnavailable: {{ $root.Values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "cronoq.selectorLabels" $root | nindent 6 }}
      {{- with .shard }}
      cronoq.io/shard: {{ .name }}
      {{- end }}
{{- end -}}

{{/* A Service: the main one (no shard) selects every server pod, a shard's only its own. */}}
{{- define "cronoq.service" -}}
{{- $root := .root -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "cronoq.labels" $root | nindent 4 }}
    {{- with .shard }}
    cronoq.io/shard: {{ .name }}
    {{- end }}
  {{- with $root.Values.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ .type }}
  selector:
    {{- include "cronoq.selectorLabels" $root | nindent 4 }}
    {{- with .shard }}
    cronoq.io/shard: {{ .name }}
    {{- end }}
  ports:
    - name: grpc
      port: {{ int $root.Values.server.grpcPort }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: http
      port: {{ int $root.Values.server.httpPort }}
      targetPort: http
      protocol: TCP
{{- end -}}
