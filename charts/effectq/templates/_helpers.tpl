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
app.kubernetes.io/version: {{ include "effectq.version" . | quote }}
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

{{/*
The version that runs: the image's tag (the chart's appVersion unless image.tag is set),
as a label value ("+" of a local version is not allowed there).
*/}}
{{- define "effectq.version" -}}
{{- .Values.image.tag | default .Chart.AppVersion | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
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
{{- if ne .Values.image.pullPolicy "Always" }}
checkov.io/skip3: "CKV_K8S_15=image.pullPolicy IfNotPresent: effectq's release tags are immutable"
{{- end }}
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
the Secret, the metrics port; then the global `env`/`envFrom` and the component's own
(`.scope`: a pool, the reconciler, the API). A later source wins for a name in envFrom;
the chart's own names are refused in `env` by the schema.
*/}}
{{- define "effectq.env" -}}
{{- $root := .root -}}
envFrom:
  - configMapRef:
      name: {{ include "effectq.fullname" $root }}
  {{- with concat ($root.Values.envFrom | default list) (.scope.envFrom | default list) }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
env:
  - name: EFFECTQ_REDIS_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "effectq.secretName" $root }}
        key: EFFECTQ_REDIS_URL
  - name: EFFECTQ_BROKER_URL
    valueFrom:
      secretKeyRef:
        name: {{ include "effectq.secretName" $root }}
        key: EFFECTQ_BROKER_URL
  {{- with .metricsPort }}
  - name: EFFECTQ_METRICS_PORT
    value: {{ . | quote }}
  {{- end }}
  {{- with concat ($root.Values.env | default list) (.scope.env | default list) }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/*
The extra volumes and their mounts (global, then the component's). A mount must name a
volume the chart or the values define.
*/}}
{{- define "effectq.extraVolumes" -}}
{{- with concat (.root.Values.extraVolumes | default list) (.scope.extraVolumes | default list) }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{- define "effectq.extraVolumeMounts" -}}
{{- $volumes := concat (.root.Values.extraVolumes | default list) (.scope.extraVolumes | default list) -}}
{{- $names := list "tmp" "metrics" -}}
{{- range $volumes -}}
{{- if has .name $names -}}
{{- fail (printf "extraVolumes: the name %q is used twice or is the chart's own" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $mounts := concat (.root.Values.extraVolumeMounts | default list) (.scope.extraVolumeMounts | default list) -}}
{{- range $mounts -}}
{{- if not (has .name $names) -}}
{{- fail (printf "extraVolumeMounts: %q names no volume of extraVolumes" .name) -}}
{{- end -}}
{{- end -}}
{{- with $mounts }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{/*
Scheduling beyond nodeSelector and tolerations: affinity, priority class and topology
spread, a component's own value replacing the global one. The default spread is soft
(ScheduleAnyway) over `.selector`, the Deployment's own pods.
*/}}
{{- define "effectq.placement" -}}
{{- $root := .root -}}
{{- with .scope.affinity | default $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .scope.priorityClassName | default $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- if .scope.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml .scope.topologySpreadConstraints | nindent 2 }}
{{- else if $root.Values.topologySpread.enabled }}
{{- with $root.Values.topologySpread }}
topologySpreadConstraints:
  - maxSkew: {{ .maxSkew }}
    topologyKey: {{ .topologyKey }}
    whenUnsatisfiable: {{ .whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- $.selector | nindent 8 }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The metrics port and the probes on it: startup and liveness on /healthz (a dead or stalled
child, too many quick restarts, a reconciler with no finished pass), readiness on /readyz
(every child booted and the ledger answers). Neither reads the ledger's counters (a scrape
does).
*/}}
{{- define "effectq.probes" -}}
{{- $probes := .Values.probes -}}
ports:
  - name: metrics
    containerPort: {{ .Values.metrics.port }}
    protocol: TCP
{{- include "effectq.httpProbes" (dict "probes" $probes "port" "metrics") }}
{{- end -}}

{{- define "effectq.httpProbes" -}}
{{- range $kind, $path := dict "startupProbe" "/healthz" "livenessProbe" "/healthz" "readinessProbe" "/readyz" }}
{{ $kind }}:
  httpGet:
    path: {{ $path }}
    port: {{ $.port }}
  {{- toYaml (index $.probes (trimSuffix "Probe" $kind)) | nindent 2 }}
{{- end }}
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
