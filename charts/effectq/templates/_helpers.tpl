{{/*
Names. The full name is at most 40 characters so that "<fullname>-worker-<pool>" (pool
names are at most 15) stays a valid DNS label.
*/}}
{{- define "effectq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "effectq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "effectq.secretName" -}}
{{- .Values.secret.existingSecret | default (include "effectq.fullname" .) -}}
{{- end -}}

{{- define "effectq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "effectq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "effectq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "effectq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: effectq
{{- end -}}

{{/*
The pools, each merged over poolDefaults: a pool's top-level keys replace the defaults
(`resources` as a whole), its `autoscaling` keys replace theirs one by one. Plain `set`:
a pool's value wins whatever it is (`minReplicas: 0` included), however the Helm version's
mergo treats zero values. Also refuses duplicate names and impossible replica bounds.
Returns JSON (read it back with fromJsonArray).
*/}}
{{- define "effectq.pools" -}}
{{- $seen := dict -}}
{{- $pools := list -}}
{{- range .Values.pools -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "pools: the name %q is used by two pools" .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- $pool := deepCopy $.Values.poolDefaults -}}
{{- range $key, $value := . -}}
{{- if ne $key "autoscaling" -}}
{{- $_ := set $pool $key $value -}}
{{- end -}}
{{- end -}}
{{- range $key, $value := (.autoscaling | default dict) -}}
{{- $_ := set $pool.autoscaling $key $value -}}
{{- end -}}
{{- $as := $pool.autoscaling -}}
{{- if gt (int $as.minReplicas) (int $as.maxReplicas) -}}
{{- fail (printf "pools: %q has autoscaling.minReplicas above maxReplicas" .name) -}}
{{- end -}}
{{- if and (eq $as.kind "hpa") (lt (int $as.minReplicas) 1) -}}
{{- fail (printf "pools: %q: an HPA needs minReplicas >= 1 (scaling to zero needs KEDA)" .name) -}}
{{- end -}}
{{- $pools = append $pools $pool -}}
{{- end -}}
{{- toJson $pools -}}
{{- end -}}

{{- define "effectq.workerName" -}}
{{- printf "%s-worker-%s" (include "effectq.fullname" .root) .pool.name -}}
{{- end -}}

{{- define "effectq.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
checkov skips shared by every Deployment, each with its reason (docs/helm.md lists them).
*/}}
{{- define "effectq.checkovSkips" -}}
checkov.io/skip1: "CKV_K8S_35=effectq reads its ledger and broker URLs from the environment only"
{{- if not .Values.image.digest }}
checkov.io/skip2: "CKV_K8S_43=image.digest is empty, so the image is pinned by its tag only"
{{- end }}
{{- end -}}

{{- define "effectq.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsGroup }}
fsGroup: {{ .Values.podSecurityContext.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "effectq.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsGroup }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
The environment every effectq container gets: the settings ConfigMap, the two URLs from
the Secret, the metrics port.
*/}}
{{- define "effectq.env" -}}
envFrom:
  - configMapRef:
      name: {{ include "effectq.fullname" . }}
env:
  - name: EFFECTQ_REDIS_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "effectq.secretName" . }}
        key: EFFECTQ_REDIS_URL
  - name: EFFECTQ_BROKER_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "effectq.secretName" . }}
        key: EFFECTQ_BROKER_URL
  - name: EFFECTQ_METRICS_PORT
    value: {{ .Values.metrics.port | quote }}
{{- end -}}

{{/*
The metrics port, and liveness and readiness on it: the port accepts connections (a TCP
check, not a scrape: a scrape reads the ledger).
*/}}
{{- define "effectq.probes" -}}
ports:
  - name: metrics
    containerPort: {{ .Values.metrics.port }}
    protocol: TCP
livenessProbe:
  tcpSocket:
    port: metrics
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 6
readinessProbe:
  tcpSocket:
    port: metrics
  periodSeconds: 10
{{- end -}}

{{/*
Pod template annotations: roll the pods when the settings or the chart's Secret change.
*/}}
{{- define "effectq.podAnnotations" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if not .Values.secret.existingSecret }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- end -}}

{{- define "effectq.scheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
