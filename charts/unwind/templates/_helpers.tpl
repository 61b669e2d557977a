{{/*
Chart name, truncated to 63 characters (the DNS label limit).
*/}}
{{- define "unwind.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name: fullnameOverride, else the release name when it already
contains the chart name (release "unwind" gives "unwind"), else
"<release>-<chart>".
*/}}
{{- define "unwind.fullname" -}}
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

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "unwind.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels every object carries.
*/}}
{{- define "unwind.labels" -}}
helm.sh/chart: {{ include "unwind.chart" . }}
{{ include "unwind.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: unwind
{{- end }}

{{/*
Labels that select the operator pod; they never change across upgrades.
*/}}
{{- define "unwind.selectorLabels" -}}
app.kubernetes.io/name: {{ include "unwind.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "unwind.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "unwind.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator image: repository:tag, the tag defaulting to the appVersion.
*/}}
{{- define "unwind.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Fixed object names the operator's code uses in its own namespace (see
docs/chart.md); the keys Role is narrowed to them.
*/}}
{{- define "unwind.signingKeySecretName" -}}unwind-signing-key{{- end }}
{{- define "unwind.trustConfigMapName" -}}unwind-trust{{- end }}
{{- define "unwind.webhookTLSSecretName" -}}unwind-webhook-tls{{- end }}
{{- define "unwind.leaseName" -}}unwind-operator{{- end }}

{{/*
The bundle publisher's ConfigMap rules. Writes are limited by name to unwind-bundle and its
shards unwind-bundle-{a,b}-{0..63} (the names are fixed so RBAC can list them): the token
cannot rewrite any other ConfigMap (unwind-trust, kube-system's). `create` cannot be limited
by name (the object has none yet when the request is authorized). list/watch find the
bundles by their label.
*/}}
{{- define "unwind.bundleRules" -}}
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create"]
- apiGroups: [""]
  resources: ["configmaps"]
  resourceNames:
    - unwind-bundle
    {{- range $slot := list "a" "b" }}
    {{- range $n := until 64 }}
    - {{ printf "unwind-bundle-%s-%d" $slot $n }}
    {{- end }}
    {{- end }}
  verbs: ["get", "update", "delete"]
{{- end }}

{{/*
Rollback rules (operator/jobs.py, handler undo_job_changed): one undo Job per step,
watched to completion and read back from its pod's termination message. Cluster-wide, or
in each watched namespace's Role.
*/}}
{{- define "unwind.rollbackRules" -}}
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list"]
# Why an undo pod cannot start (a missing Secret, FailedMount) shows only in its Events.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list"]
# The rollback's planner reads who holds a pending entry's idempotency key (the gateways'
# Leases unwind-key-<hash>): a call that never held it never ran (operator/jobs.py: holders).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get"]
{{- end }}
