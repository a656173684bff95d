{{/*
The name of the ServiceAccount, Deployment, Services, roles and the
ValidatingWebhookConfiguration: the release name when it contains
"nodewarden" (release "nodewarden" gives manifests/base's names), else
"<release>-nodewarden". Short enough for "<name>-metrics" to stay a DNS label.
*/}}
{{- define "nodewarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else if contains "nodewarden" .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-nodewarden" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* What selects nodewarden's pods (as in manifests/base). */}}
{{- define "nodewarden.selectorLabels" -}}
app.kubernetes.io/name: nodewarden
{{- end -}}

{{/* Every object's labels: the selector label and Helm's usual ones. */}}
{{- define "nodewarden.labels" -}}
{{ include "nodewarden.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{/*
These names are nodewarden's defaults, which the chart keeps: the Service
is the name nodewarden's own serving certificate is made for, the Secret
holds the certificates (--webhook-secret).
*/}}
{{- define "nodewarden.webhookService" -}}nodewarden-webhook{{- end -}}
{{- define "nodewarden.webhookSecret" -}}nodewarden-webhook-tls{{- end -}}

{{- define "nodewarden.webhookEnabled" -}}
{{- if ne .Values.webhook.certificates "off" }}true{{ end -}}
{{- end -}}

{{- define "nodewarden.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
One `- "--name=value"` item of the container's args, or nothing when the
value is null or empty (nodewarden's default applies). Whole numbers print
as integers: YAML numbers reach templates as floats, which would print
600000 as 6e+05. Called with (list "name" value).
*/}}
{{- define "nodewarden.flag" -}}
{{- $name := index . 0 -}}
{{- $value := index . 1 -}}
{{- if not (or (kindIs "invalid" $value) (eq (toString $value) "")) -}}
{{- if and (kindIs "float64" $value) (eq $value (floor $value)) -}}
{{- $value = int64 $value -}}
{{- end }}
- {{ printf "--%s=%v" $name $value | quote }}
{{- end -}}
{{- end -}}

{{/* The sim-cloud's address: as given, else the Service sim-cloud of the release namespace. */}}
{{- define "nodewarden.simAddress" -}}
{{- .Values.cloud.sim.address | default (printf "http://sim-cloud.%s:8090" .Release.Namespace) -}}
{{- end -}}

{{/*
Whether the pods read the control plane's etcd certificates through a
hostPath (etcd found as Constellation finds it): on unless endpoints are
given or etcd is external.
*/}}
{{- define "nodewarden.hostPKI" -}}
{{- $e := .Values.etcd -}}
{{- if and $e.hostPKI.enabled (not $e.endpoints) (ne (include "nodewarden.etcdOnControlPlane" .) "false") }}true{{ end -}}
{{- end -}}

{{/*
--etcd-on-control-plane: etcd.onControlPlane, else the older
webhook.etcdOnControlPlane; "true" and "false" also as booleans (what
`--set etcd.onControlPlane=false` gives), which `default` would pass over.
*/}}
{{- define "nodewarden.etcdOnControlPlane" -}}
{{- $given := "" -}}
{{- range list .Values.etcd.onControlPlane .Values.webhook.etcdOnControlPlane -}}
{{- if and (eq $given "") (or (kindIs "bool" .) (ne (toString (. | default "")) "")) -}}
{{- $given = toString . -}}
{{- end -}}
{{- end -}}
{{- $given -}}
{{- end -}}

{{/* Where the pod keeps its copy of the etcd certificates. */}}
{{- define "nodewarden.etcdPKIDir" -}}/var/run/nodewarden/etcd-pki{{- end -}}

{{/* Whether Constellation's upgrade-agent socket is relayed into the pod. */}}
{{- define "nodewarden.upgradeAgent" -}}
{{- $a := .Values.upgradeAgent -}}
{{- if or (eq (toString $a.enabled) "true") (and (eq (toString $a.enabled) "auto") (has .Values.cloud.provider (list "aws" "gcp" "azure"))) }}true{{ end -}}
{{- end -}}

{{/* Where the GCP service account's key Secret is mounted. */}}
{{- define "nodewarden.gcpKeyDir" -}}/etc/nodewarden/gcp{{- end -}}

{{/* Where nodewarden reaches the relayed upgrade-agent socket. */}}
{{- define "nodewarden.upgradeAgentDir" -}}/var/run/nodewarden/upgrade-agent{{- end -}}
