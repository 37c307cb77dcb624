{{/* Names, labels and the values several templates share. */}}

{{- define "iblab.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "iblab.fullname" -}}
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

{{- define "iblab.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object; pass (dict "ctx" $ "component" "operator"). */}}
{{- define "iblab.labels" -}}
helm.sh/chart: {{ include "iblab.chart" .ctx }}
{{ include "iblab.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: iblab
{{- end }}

{{- define "iblab.selectorLabels" -}}
app.kubernetes.io/name: {{ include "iblab.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "iblab.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-operator" (include "iblab.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "iblab.operatorImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The device-plugin resource lab pods ask for, or "" (IBLAB_KUBE_RDMA_RESOURCE). */}}
{{- define "iblab.rdmaResource" -}}
{{- if .Values.rdma.resourceName }}
{{- printf "%s/%s" .Values.rdma.resourcePrefix .Values.rdma.resourceName }}
{{- end }}
{{- end }}

{{/* KUBERNETES_SERVICE_HOST/PORT for clusters without kube-proxy (apiServer.*). */}}
{{- define "iblab.apiServerEnv" -}}
{{- if .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ default "443" .Values.apiServer.port | toString | quote }}
{{- end }}
{{- end }}

{{/* The container securityContext of the operator and the test pod: PodSecurity restricted. */}}
{{- define "iblab.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "iblab.restrictedPod" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The PodSecurity level the release namespace needs with these values. */}}
{{- define "iblab.podSecurityLevel" -}}
{{- if or .Values.nodePrep.enabled .Values.rdmaSharedDevicePlugin.enabled }}privileged{{ else }}restricted{{ end }}
{{- end }}
