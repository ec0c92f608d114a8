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

{{/*
The webhook's TLS material, as JSON: "caBundle" (base64 PEM, for the webhook configuration)
and, when the chart makes the Secret, "tls.crt"/"tls.key" (base64 PEM). From, in order:
webhook.tls.existingSecret (with webhook.tls.caBundle: the same on every render), the Secret
of a previous install (lookup: stable across helm upgrade; `helm template` sees no cluster),
or a new CA and certificate. Computed once per render and kept in the root context, so the
Secret, the webhook configuration and the Deployment's checksum annotation agree.
Not used with cert-manager (it issues the certificate and injects the CA).
*/}}
{{- define "durable-producer.webhookTLS" -}}
{{- if not (hasKey $ "durableProducerWebhookTLS") }}
{{- $wh := .Values.webhook }}
{{- $tls := dict }}
{{- if $wh.tls.existingSecret }}
{{- $_ := set $tls "caBundle" $wh.tls.caBundle }}
{{- else }}
{{- $fullname := include "durable-producer.fullname" . }}
{{- $service := printf "%s-webhook" $fullname }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "durable-producer.webhookSecretName" .) }}
{{- if and $existing $existing.data (hasKey $existing.data "ca.crt") }}
{{- $_ := set $tls "tls.crt" (index $existing.data "tls.crt") }}
{{- $_ := set $tls "tls.key" (index $existing.data "tls.key") }}
{{- $_ := set $tls "caBundle" (index $existing.data "ca.crt") }}
{{- else }}
{{- $ca := genCA (printf "%s-webhook-ca" $fullname) (int $wh.certificateValidityDays) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $service .Release.Namespace) nil (include "durable-producer.webhookDNSNames" . | fromJsonArray) (int $wh.certificateValidityDays) $ca }}
{{- $_ := set $tls "tls.crt" ($cert.Cert | b64enc) }}
{{- $_ := set $tls "tls.key" ($cert.Key | b64enc) }}
{{- $_ := set $tls "caBundle" ($ca.Cert | b64enc) }}
{{- end }}
{{- end }}
{{- $_ := set $ "durableProducerWebhookTLS" $tls }}
{{- end }}
{{- toJson (get $ "durableProducerWebhookTLS") }}
{{- end }}

{{/*
The DNS names of the webhook Service, as a JSON list.
*/}}
{{- define "durable-producer.webhookDNSNames" -}}
{{- $service := printf "%s-webhook" (include "durable-producer.fullname" .) }}
{{- toJson (list $service (printf "%s.%s" $service .Release.Namespace) (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace)) }}
{{- end }}

{{/*
The Secret mounted by the operator for its webhook server.
*/}}
{{- define "durable-producer.webhookMountedSecret" -}}
{{- .Values.webhook.tls.existingSecret | default (include "durable-producer.webhookSecretName" .) }}
{{- end }}

{{/*
The namespaceSelector of the webhook: webhook.namespaceSelector, narrowed to the watched
namespaces when operator.watchNamespaces is set (the operator can serve no other: it may not
read DurableProducers there).
*/}}
{{- define "durable-producer.webhookNamespaceSelector" -}}
{{- $selector := deepCopy (.Values.webhook.namespaceSelector | default dict) }}
{{- with .Values.operator.watchNamespaces }}
{{- $watched := dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" . }}
{{- $_ := set $selector "matchExpressions" (append ($selector.matchExpressions | default list) $watched) }}
{{- end }}
{{- toYaml $selector }}
{{- end }}

{{/*
The operator features switched on (rbac.features.*), for DURABLE_PRODUCER_FEATURES.
*/}}
{{- define "durable-producer.features" -}}
{{- $on := list }}
{{- range $name, $enabled := .Values.rbac.features }}
{{- if $enabled }}
{{- $on = append $on $name }}
{{- end }}
{{- end }}
{{- join "," $on }}
{{- end }}
