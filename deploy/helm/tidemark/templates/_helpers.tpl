{{/* Names and labels. Every object is named after the release: two releases in one
     cluster (in one namespace or two) never collide. */}}
{{- define "tidemark.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (default "operator" .Values.nameOverride) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tidemark.serviceAccountName" -}}
{{- default (include "tidemark.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "tidemark.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "tidemark-%s" (default "operator" .Values.nameOverride) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tidemark.labels" -}}
{{ include "tidemark.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tidemark.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
