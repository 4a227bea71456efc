{{- define "gpu-dra-driver.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-dra-driver.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpu-dra-driver.labels" -}}
app.kubernetes.io/name: {{ include "gpu-dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpu-dra-driver.selector" -}}
app.kubernetes.io/name: {{ include "gpu-dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpu-dra-driver.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpu-dra-driver.pluginServiceAccount" -}}
{{ include "gpu-dra-driver.fullname" . }}-kubelet-plugin
{{- end -}}

{{- define "gpu-dra-driver.controllerServiceAccount" -}}
{{ include "gpu-dra-driver.fullname" . }}-controller
{{- end -}}

{{- define "gpu-dra-driver.webhookName" -}}
{{ include "gpu-dra-driver.fullname" . }}-webhook
{{- end -}}

{{- define "gpu-dra-driver.webhookSecret" -}}
{{- if eq .Values.webhook.tls.mode "secret" -}}
{{ required "webhook.tls.secret.name is required with webhook.tls.mode=secret" .Values.webhook.tls.secret.name }}
{{- else -}}
{{ include "gpu-dra-driver.webhookName" . }}-tls
{{- end -}}
{{- end -}}

{{- /* TimeSlicingSettings=true,MPSSupport=false from the featureGates map. */ -}}
{{- define "gpu-dra-driver.featureGates" -}}
{{- $gates := list -}}
{{- range $name, $on := .Values.featureGates -}}
{{- $gates = append $gates (printf "%s=%t" $name $on) -}}
{{- end -}}
{{- join "," $gates -}}
{{- end -}}
