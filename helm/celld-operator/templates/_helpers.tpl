{{/* Common names and labels. */}}
{{- define "celld-operator.name" -}}celld-operator{{- end -}}

{{- define "celld-operator.labels" -}}
app.kubernetes.io/name: celld-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "celld-operator.selector" -}}
app.kubernetes.io/name: celld-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
