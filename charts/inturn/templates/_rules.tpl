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
{{- $np := .Values.networkPolicy }}
{{- if and $np.enabled $np.workers.enabled (not (.Values.operator.watchNamespaces | default $np.workers.namespaces)) }}
# each worker's NetworkPolicy, owned by its Destination (the garbage collector deletes it)
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- if eq .Values.operator.workerLogins "per-destination" }}
# each Destination's worker login: its Secret is read and made (never changed or deleted:
# the garbage collector removes it with its Destination)
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
{{- end }}
{{- end }}
