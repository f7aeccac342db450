{{/* Peers from namespace names, CIDRs and raw peers: include "inturn.np.peers" (list NAMESPACES CIDRS PEERS).
     Renders nothing when all three are empty (an empty "from" would allow everyone). */}}
{{- define "inturn.np.peers" -}}
{{- range (index . 0) }}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ . }}
{{- end }}
{{- range (index . 1) }}
- ipBlock:
    cidr: {{ . }}
{{- end }}
{{- with (index . 2) }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Who may reach a metrics / health port: the monitoring namespaces and peers, and probes.from. */}}
{{- define "inturn.np.monitoringPeers" -}}
{{- $np := .Values.networkPolicy -}}
{{- include "inturn.np.peers" (list $np.monitoring.namespaces (list) (concat $np.monitoring.peers $np.probes.from)) }}
{{- end }}

{{/* Egress every component needs: Postgres and DNS. */}}
{{- define "inturn.np.baseEgress" -}}
{{- $np := .Values.networkPolicy -}}
# Postgres
- ports:
    - protocol: TCP
      port: {{ $np.postgres.port }}
  {{- with $np.postgres.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
# DNS
- ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
  {{- with $np.dns.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
