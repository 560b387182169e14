{{/* Name of the chart, for the app.kubernetes.io/name label. */}}
{{- define "rlkube.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects: the release name, with the chart name appended unless
     the release name already contains it. Truncated to 63 characters (a DNS label). */}}
{{- define "rlkube.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator's pod; never change them across upgrades (the Deployment's
     selector is immutable). */}}
{{- define "rlkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels on every object of the release; `helm uninstall` leaves none of them behind. */}}
{{- define "rlkube.labels" -}}
{{ include "rlkube.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "rlkube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rlkube.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rlkube.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* "true" when the operator watches every namespace (watchNamespaces is empty). */}}
{{- define "rlkube.clusterWide" -}}
{{- if empty .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* PolicyRules from files/rbac.yaml (generated from rlkube.operator.controller.rbac), each verb under a
     comment saying why the operator needs it. Call with (list $ "<section>"). */}}
{{- define "rlkube.rules" -}}
{{- $root := index . 0 -}}
{{- $section := index . 1 -}}
{{- $rules := index ($root.Files.Get "files/rbac.yaml" | fromYaml) $section -}}
{{- if not $rules }}{{ fail (printf "files/rbac.yaml: section %s is missing or empty; run make chart-rbac" $section) }}{{ end -}}
{{- range $rules }}
- apiGroups: {{ toJson .apiGroups }}
  resources: {{ toJson .resources }}
  verbs:
  {{- range .verbs }}
    # {{ .why | replace "\n" " " }}
    - {{ .verb }}
  {{- end }}
{{- end }}
{{- end -}}
