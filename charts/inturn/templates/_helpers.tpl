{{- define "inturn.fullname" -}}
{{ .Release.Name | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "inturn.image" -}}
{{ required "image.repository is required: build the image from the Containerfile, push it to your registry and set image.repository (and image.tag) to it; see docs/howto/kubernetes.md, \"Build the image\"" .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "inturn.labels" -}}
app.kubernetes.io/name: inturn
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: inturn
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "inturn.operatorServiceAccount" -}}
{{ .Values.operator.serviceAccount.name | default (printf "%s-operator" (include "inturn.fullname" .)) }}
{{- end }}

{{- define "inturn.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurity.runAsUser }}
runAsGroup: {{ .Values.podSecurity.runAsUser }}
fsGroup: {{ .Values.podSecurity.runAsUser }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "inturn.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "inturn.worklistEnv" -}}
{{- with .Values.worklist }}
{{- if .notifyChannel }}
- name: INTURN_WORKLIST_NOTIFY
  value: {{ .notifyChannel | quote }}
{{- end }}
{{- if .webhook.url }}
- name: INTURN_WORKLIST_WEBHOOK_URL
  value: {{ .webhook.url | quote }}
- name: INTURN_WORKLIST_WEBHOOK_TIMEOUT
  value: {{ .webhook.timeoutSeconds | quote }}
- name: INTURN_WORKLIST_WEBHOOK_ATTEMPTS
  value: {{ .webhook.attempts | quote }}
{{- with .webhook.secretRef }}
- name: INTURN_WORKLIST_WEBHOOK_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- if .nats.url }}
- name: INTURN_WORKLIST_NATS_URL
  value: {{ .nats.url | quote }}
- name: INTURN_WORKLIST_NATS_SUBJECT
  value: {{ .nats.subject | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The worklist publishers of the workers, as operator arguments: the webhook's HMAC key by
     reference to a Secret of that name in each Destination's namespace (as for the DSN). */}}
{{- define "inturn.worklistWorkerArgs" -}}
{{- with .Values.workers.lease }}
{{- if .ttlSeconds }}
- --worker-env=INTURN_LEASE_TTL_SECONDS={{ .ttlSeconds }}
{{- end }}
{{- if .renewSeconds }}
- --worker-env=INTURN_LEASE_RENEW_SECONDS={{ .renewSeconds }}
{{- end }}
{{- if .acquireSeconds }}
- --worker-env=INTURN_LEASE_ACQUIRE_SECONDS={{ .acquireSeconds }}
{{- end }}
{{- end }}
{{- with .Values.workers.pollSeconds }}
- --worker-env=INTURN_POLL_SECONDS={{ . }}
{{- end }}
{{- with .Values.workers.listenSecret }}
{{- if .name }}
- --worker-secret-env=INTURN_LISTEN_DSN={{ .name }}/{{ .key }}
{{- end }}
{{- end }}
{{- range $name, $value := .Values.tracing.env }}
- --worker-env={{ $name }}={{ $value }}
{{- end }}
{{- with .Values.worklist }}
{{- if .notifyChannel }}
- --worker-env=INTURN_WORKLIST_NOTIFY={{ .notifyChannel }}
{{- end }}
{{- if .webhook.url }}
- --worker-env=INTURN_WORKLIST_WEBHOOK_URL={{ .webhook.url }}
- --worker-env=INTURN_WORKLIST_WEBHOOK_TIMEOUT={{ .webhook.timeoutSeconds }}
- --worker-env=INTURN_WORKLIST_WEBHOOK_ATTEMPTS={{ .webhook.attempts }}
{{- with .webhook.secretRef }}
- --worker-secret-env=INTURN_WORKLIST_WEBHOOK_SECRET={{ .name }}/{{ .key }}
{{- end }}
{{- end }}
{{- if .nats.url }}
- --worker-env=INTURN_WORKLIST_NATS_URL={{ .nats.url }}
- --worker-env=INTURN_WORKLIST_NATS_SUBJECT={{ .nats.subject }}
{{- end }}
{{- end }}
{{- end }}

{{/* The DSN Secret of one component: (list $ "ingest") -> {"name": ..., "key": ...}, its own
     Secret and key when set, else the shared ones. */}}
{{- define "inturn.dsnSecret" -}}
{{- $root := index . 0 -}}
{{- $db := $root.Values.database -}}
{{- $own := index $db.components (index . 1) | default dict -}}
name: {{ $own.existingSecret | default $db.existingSecret }}
key: {{ $own.key | default $db.key }}
{{- end }}

{{/* INTURN_DSN from the component's Secret: include "inturn.dsnEnv" (list $ "ingest") */}}
{{- define "inturn.dsnEnv" -}}
- name: INTURN_DSN
  valueFrom:
    secretKeyRef:
      {{- include "inturn.dsnSecret" . | nindent 6 }}
{{- end }}

{{/* Payload encryption (encryption.secretName): the variables, mount and volume of a component
     that stores or reads payloads (ingest, the console; the operator gives workers theirs). */}}
{{- define "inturn.payloadKeysEnv" -}}
{{- if .Values.encryption.secretName }}
- name: INTURN_PAYLOAD_KEYS
  value: /etc/inturn/payload-keys
- name: INTURN_KEY_DSN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.encryption.keyStore.existingSecret }}
      key: {{ .Values.encryption.keyStore.key }}
{{- end }}
{{- end }}

{{- define "inturn.payloadKeysMount" -}}
{{- if .Values.encryption.secretName }}
- name: payload-keys
  mountPath: /etc/inturn/payload-keys
  readOnly: true
{{- end }}
{{- end }}

{{- define "inturn.payloadKeysVolume" -}}
{{- if .Values.encryption.secretName }}
- name: payload-keys
  secret:
    secretName: {{ .Values.encryption.secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/*
Ingest's resources: the memory request and limit follow from the largest message and how many
are held at once (docs/explanation/memory.md): 96 MiB + 4 x N x (S + 64 KiB) rounded up to a
MiB, i.e. 96 + 4 x maxMessageMiB x concurrentMessages + ceil(concurrentMessages / 4) MiB, for
the limit, the same with N = 1 for the request; values set in ingest.resources win.
*/}}
{{- define "inturn.ingestResources" -}}
{{- $mib := int .Values.ingest.maxMessageMiB -}}
{{- $count := int .Values.ingest.concurrentMessages -}}
{{- $resources := deepCopy (.Values.ingest.resources | default dict) -}}
{{- $requests := $resources.requests | default dict -}}
{{- $limits := $resources.limits | default dict -}}
{{- if not $requests.memory }}{{ $_ := set $requests "memory" (printf "%dMi" (add 96 (mul 4 $mib) 1)) }}{{ end -}}
{{- if not $limits.memory }}{{ $_ := set $limits "memory" (printf "%dMi" (add 96 (mul 4 $mib $count) (div (add $count 3) 4))) }}{{ end -}}
{{- $_ := set $resources "requests" $requests -}}
{{- $_ := set $resources "limits" $limits -}}
{{- toYaml $resources -}}
{{- end }}
