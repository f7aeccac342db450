{{- define "inturn.fullname" -}}
{{ .Release.Name | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "inturn.image" -}}
{{ required "image.repository is required: build the image from the Containerfile, push it to your registry and set image.repository (and image.tag) to it; see the README, \"The container image\"" .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
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
