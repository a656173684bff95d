{{/*
The container's args: `nodewarden run` with the flags the values ask for
(tests/it/chart.rs checks that `nodewarden run` takes every one).
*/}}
{{- define "nodewarden.args" -}}
{{- $v := .Values -}}
- run
- --http-addr=0.0.0.0:8080
{{- if include "nodewarden.webhookEnabled" . }}
- --webhook-addr=0.0.0.0:9443
{{- if eq $v.webhook.certificates "cert-manager" }}
- --webhook-certs=cert-manager
{{- end }}
{{- $configuration := include "nodewarden.fullname" . }}
{{- if ne $configuration "nodewarden" }}
- --webhook-configuration={{ $configuration }}
{{- end }}
{{- end }}
{{- if eq $v.cloud.provider "sim" }}
- --cloud=sim
- --sim-cloud={{ include "nodewarden.simAddress" . }}
{{- end }}
{{- if eq $v.cloud.provider "aws" }}
{{- include "nodewarden.flag" (list "aws-endpoint" $v.cloud.aws.endpoint) }}
{{- include "nodewarden.flag" (list "aws-call-timeout" $v.cloud.aws.callTimeout) }}
{{- end }}
{{- if eq $v.cloud.provider "gcp" }}
{{- include "nodewarden.flag" (list "gcp-endpoint" $v.cloud.gcp.endpoint) }}
{{- include "nodewarden.flag" (list "gcp-call-timeout" $v.cloud.gcp.callTimeout) }}
{{- end }}
{{- if eq $v.cloud.provider "azure" }}
{{- include "nodewarden.flag" (list "azure-endpoint" $v.cloud.azure.endpoint) }}
{{- include "nodewarden.flag" (list "azure-call-timeout" $v.cloud.azure.callTimeout) }}
{{- end }}
{{- if ne $v.cloud.provider "none" }}
{{- include "nodewarden.flag" (list "cloud-qps" $v.cloud.qps) }}
{{- include "nodewarden.flag" (list "cloud-burst" $v.cloud.burst) }}
{{- end }}
{{- if $v.log.json }}
- --log-json
{{- end }}
{{- include "nodewarden.flag" (list "lease-duration" $v.leaderElection.leaseDuration) }}
{{- include "nodewarden.flag" (list "renew-deadline" $v.leaderElection.renewDeadline) }}
{{- include "nodewarden.flag" (list "retry-period" $v.leaderElection.retryPeriod) }}
{{- include "nodewarden.flag" (list "workers" $v.workers) }}
{{- include "nodewarden.flag" (list "node-selector" $v.manage.nodes) }}
{{- include "nodewarden.flag" (list "object-selector" $v.manage.objects) }}
{{- include "nodewarden.flag" (list "max-concurrent-maintenance" $v.maintenance.maxConcurrent) }}
{{- if ne $v.maintenance.leaseNamespace "medik8s-leases" }}
{{- include "nodewarden.flag" (list "maintenance-lease-namespace" $v.maintenance.leaseNamespace) }}
{{- end }}
{{- include "nodewarden.flag" (list "rollout-max-surge" $v.rollout.maxSurge) }}
{{- include "nodewarden.flag" (list "rollout-max-unavailable" $v.rollout.maxUnavailable) }}
{{- include "nodewarden.flag" (list "rollout-control-plane-first" $v.rollout.controlPlaneFirst) }}
{{- include "nodewarden.flag" (list "rollout-join-timeout" $v.rollout.joinTimeout) }}
{{- include "nodewarden.flag" (list "rollout-drain-timeout" $v.rollout.drainTimeout) }}
{{- include "nodewarden.flag" (list "rollout-halt-after-failed-joins" $v.rollout.haltAfterFailedJoins) }}
{{- include "nodewarden.flag" (list "rollout-halt-after-unready-pods" $v.rollout.haltAfterUnreadyPods) }}
{{- include "nodewarden.flag" (list "rollout-pod-ready-timeout" $v.rollout.podReadyTimeout) }}
{{- with $v.rollout.waves }}
{{- include "nodewarden.flag" (list "rollout-waves" (join "," .)) }}
{{- end }}
{{- include "nodewarden.flag" (list "rollout-soak-time" $v.rollout.soakTime) }}
{{- include "nodewarden.flag" (list "rollout-topology-key" $v.rollout.topologyKey) }}
{{- with $v.etcd.endpoints }}
{{- include "nodewarden.flag" (list "etcd-endpoints" (join "," .)) }}
{{- end }}
{{- if $v.etcd.clientSecret }}
- --etcd-ca=/etc/nodewarden/etcd/ca.crt
- --etcd-cert=/etc/nodewarden/etcd/tls.crt
- --etcd-key=/etc/nodewarden/etcd/tls.key
{{- end }}
{{- include "nodewarden.flag" (list "etcd-timeout" $v.etcd.timeout) }}
{{- include "nodewarden.flag" (list "etcd-client-port" $v.etcd.clientPort) }}
{{- include "nodewarden.flag" (list "etcd-on-control-plane" (include "nodewarden.etcdOnControlPlane" .)) }}
{{- if include "nodewarden.hostPKI" . }}
- --etcd-pki-dir={{ include "nodewarden.etcdPKIDir" . }}
{{- end }}
{{- if include "nodewarden.upgradeAgent" . }}
- --upgrade-agent-socket={{ include "nodewarden.upgradeAgentDir" . }}/agent.sock
{{- include "nodewarden.flag" (list "upgrade-agent-timeout" $v.upgradeAgent.timeout) }}
{{- end }}
{{- include "nodewarden.flag" (list "plan-namespace" $v.plans.namespace) }}
{{- include "nodewarden.flag" (list "plan-channel-poll" $v.plans.channelPoll) }}
{{- include "nodewarden.flag" (list "plan-settle" $v.plans.settle) }}
{{- include "nodewarden.flag" (list "plan-job-deadline" $v.plans.jobDeadline) }}
{{- include "nodewarden.flag" (list "plan-job-deadline-max" $v.plans.jobDeadlineMax) }}
{{- include "nodewarden.flag" (list "plan-job-backoff-limit" $v.plans.jobBackoffLimit) }}
{{- include "nodewarden.flag" (list "plan-job-ttl" $v.plans.jobTTL) }}
{{- include "nodewarden.flag" (list "plan-job-privileged" $v.plans.jobPrivileged) }}
{{- include "nodewarden.flag" (list "plan-job-image-pull-policy" $v.plans.jobImagePullPolicy) }}
{{- include "nodewarden.flag" (list "plan-job-pod-replacement-policy" $v.plans.jobPodReplacementPolicy) }}
{{- include "nodewarden.flag" (list "plan-controller-name" $v.plans.controllerName) }}
{{- if ne $v.sip "auto" }}
{{- include "nodewarden.flag" (list "sip" $v.sip) }}
{{- end }}
{{- if include "nodewarden.webhookEnabled" . }}
{{- include "nodewarden.flag" (list "webhook-handshake-timeout" $v.webhook.handshakeTimeout) }}
{{- include "nodewarden.flag" (list "webhook-request-timeout" $v.webhook.requestTimeout) }}
{{- include "nodewarden.flag" (list "webhook-max-connections" $v.webhook.maxConnections) }}
{{- include "nodewarden.flag" (list "webhook-max-in-flight" $v.webhook.maxInFlight) }}
{{- end }}
{{- range $v.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
