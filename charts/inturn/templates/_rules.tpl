{{- define "inturn.operatorRules" -}}
- apiGroups: ["inturn.dev"]
  resources: ["destinations"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["inturn.dev"]
  resources: ["destinations/status"]
  verbs: ["get", "patch"]
# owner references with blockOwnerDeletion need update on the owner's finalizers
- apiGroups: ["inturn.dev"]
  resources: ["destinations/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if eq .Values.operator.workerLogins "per-destination" }}
# each Destination's worker login: its Secret is read and made (never changed or deleted:
# the garbage collector removes it with its Destination)
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
{{- end }}
{{- end }}
