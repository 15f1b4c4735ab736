{{/* Names: <release> when it already holds the chart name, else <release>-karpenter-hub. */}}
{{- define "karpenter-hub.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "karpenter-hub.fullname" -}}
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

{{/* The webhook's objects; 55 characters leave room for "-webhook" within 63. */}}
{{- define "karpenter-hub.webhookName" -}}
{{- printf "%s-webhook" (include "karpenter-hub.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "karpenter-hub.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "karpenter-hub.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "karpenter-hub.hubSelectorLabels" -}}
app.kubernetes.io/name: {{ include "karpenter-hub.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hub
{{- end }}

{{- define "karpenter-hub.webhookSelectorLabels" -}}
app.kubernetes.io/name: {{ include "karpenter-hub.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "karpenter-hub.hubServiceAccount" -}}
{{- default (include "karpenter-hub.fullname" .) .Values.hub.serviceAccount.name }}
{{- end }}

{{- define "karpenter-hub.webhookServiceAccount" -}}
{{- default (include "karpenter-hub.webhookName" .) .Values.webhook.serviceAccount.name }}
{{- end }}

{{- define "karpenter-hub.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default (printf "v%s" .Chart.AppVersion) .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Lease's namespace (and the leader election Role's). */}}
{{- define "karpenter-hub.leaseNamespace" -}}
{{- default .Release.Namespace .Values.hub.leaderElection.namespace }}
{{- end }}

{{/* The Secret the webhook serves from. */}}
{{- define "karpenter-hub.webhookTLSSecret" -}}
{{- if eq .Values.webhook.certificate.mode "self-managed" }}
{{- /* Not cert-manager's name: an install moving from cert-manager leaves that Secret behind. */}}
{{- printf "%s-cert" (include "karpenter-hub.webhookName" .) }}
{{- else if eq .Values.webhook.certificate.mode "cert-manager" }}
{{- printf "%s-tls" (include "karpenter-hub.webhookName" .) }}
{{- else }}
{{- .Values.webhook.certificate.secret.name }}
{{- end }}
{{- end }}

{{/* The default filter of `karpenter-hub run` at another level: client libraries stay at warn,
kube's client and watcher at error (at warn they log response bodies a workload cluster's
server chose). */}}
{{- define "karpenter-hub.hubLogFilter" -}}
{{- default (printf "%s,kube=warn,kube_client::client=error,kube_runtime::watcher=error,tower=warn,hyper=warn" .Values.logLevel) .Values.hub.logFilter }}
{{- end }}

{{/*
Rules values.schema.json cannot state with a readable message. Each failure names the value and
what to set instead.
*/}}
{{- define "karpenter-hub.validate" -}}
{{- if and (gt (int .Values.hub.replicas) 1) (not .Values.hub.leaderElection.enabled) }}
{{- fail (printf "hub.replicas is %d but hub.leaderElection.enabled is false: several replicas without leader election would all act on the same clusters. Set hub.leaderElection.enabled=true or hub.replicas=1." (int .Values.hub.replicas)) }}
{{- end }}
{{- if .Values.hub.sharding.enabled }}
{{- if not .Values.hub.leaderElection.enabled }}
{{- fail "hub.sharding.enabled needs hub.leaderElection.enabled: the node class and flavor catalogue status are written by the holder of the leader Lease only. Set hub.leaderElection.enabled=true." }}
{{- end }}
{{- if ge (int .Values.hub.sharding.renewDeadlineSeconds) (int .Values.hub.sharding.leaseDurationSeconds) }}
{{- fail (printf "hub.sharding.renewDeadlineSeconds (%d) must be below hub.sharding.leaseDurationSeconds (%d): a replica must stop acting on a cluster before its Lease expires and another replica may take it. Lower the deadline or raise the duration." (int .Values.hub.sharding.renewDeadlineSeconds) (int .Values.hub.sharding.leaseDurationSeconds)) }}
{{- end }}
{{- if ge (int .Values.hub.sharding.retryPeriodSeconds) (int .Values.hub.sharding.renewDeadlineSeconds) }}
{{- fail (printf "hub.sharding.retryPeriodSeconds (%d) must be below hub.sharding.renewDeadlineSeconds (%d): otherwise one missed renewal already stops a replica acting on its clusters. Lower the retry period or raise the deadline." (int .Values.hub.sharding.retryPeriodSeconds) (int .Values.hub.sharding.renewDeadlineSeconds)) }}
{{- end }}
{{- end }}
{{- if and .Values.hub.watchNamespace .Values.hub.registrationNamespaces }}
{{- fail (printf "hub.registrationNamespaces is set with hub.watchNamespace (%s): a hub serving one namespace reads registrations there only. Drop hub.registrationNamespaces." .Values.hub.watchNamespace) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (has .Values.hub.metrics.bindAddress (list "127.0.0.1" "::1")) }}
{{- fail (printf "serviceMonitor.enabled scrapes the hub's pods, but hub.metrics.bindAddress is %s, reachable from inside the pod only. Set hub.metrics.bindAddress=0.0.0.0 or serviceMonitor.enabled=false." .Values.hub.metrics.bindAddress) }}
{{- end }}
{{- if eq (int .Values.hub.metrics.port) (int .Values.hub.healthProbe.port) }}
{{- fail (printf "hub.metrics.port and hub.healthProbe.port are both %d: the probes have a listener of their own. Give them different ports." (int .Values.hub.metrics.port)) }}
{{- end }}
{{- if .Values.webhook.enabled }}
{{- if eq .Values.webhook.certificate.mode "secret" }}
{{- if not .Values.webhook.certificate.secret.name }}
{{- fail "webhook.certificate.mode is secret but webhook.certificate.secret.name is empty: name the kubernetes.io/tls Secret (in the release namespace) the webhook serves from, or use webhook.certificate.mode=cert-manager." }}
{{- end }}
{{- if not .Values.webhook.certificate.secret.caBundle }}
{{- fail "webhook.certificate.mode is secret but webhook.certificate.secret.caBundle is empty: give the CA that signed the Secret's tls.crt, PEM then base64 on one line (base64 -w0 ca.crt); without it the API server cannot trust the webhook." }}
{{- end }}
{{- if not (hasPrefix "-----BEGIN CERTIFICATE-----" (b64dec .Values.webhook.certificate.secret.caBundle)) }}
{{- fail "webhook.certificate.secret.caBundle is not a base64-encoded PEM certificate: encode the CA certificate file itself (base64 -w0 ca.crt), not the Secret or the key." }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
