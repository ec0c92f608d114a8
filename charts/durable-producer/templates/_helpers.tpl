{{/*
Chart name, overridable with nameOverride.
*/}}
{{- define "durable-producer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name used as the prefix of every resource: fullnameOverride, or release name plus chart
name (the release name alone when it already contains the chart name). Kept to 63 characters
because some Kubernetes name fields are DNS labels.
*/}}
{{- define "durable-producer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "durable-producer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Standard labels on every object.
*/}}
{{- define "durable-producer.labels" -}}
helm.sh/chart: {{ include "durable-producer.chart" . }}
{{ include "durable-producer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: durable-producer
{{- end }}

{{/*
Labels that select the operator pod; they must never change between upgrades.
*/}}
{{- define "durable-producer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "durable-producer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "durable-producer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "durable-producer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "durable-producer.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{- define "durable-producer.agentImage" -}}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) }}
{{- end }}

{{/*
The Secret holding the webhook server's certificate (chart-generated or cert-manager's).
*/}}
{{- define "durable-producer.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "durable-producer.fullname" .) }}
{{- end }}
