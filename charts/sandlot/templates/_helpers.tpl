{{/* Names, labels and the image shared by every template. */}}

{{- define "sandlot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sandlot.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sandlot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "sandlot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandlot
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include "sandlot.selectorLabels" (list . "operator") */}}
{{- define "sandlot.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "sandlot.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "sandlot.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sandlot.operatorServiceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "sandlot.fullname" .)) .Values.serviceAccount.operatorName -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.operatorName -}}
{{- end -}}
{{- end -}}

{{- define "sandlot.agentServiceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-agent" (include "sandlot.fullname" .)) .Values.serviceAccount.agentName -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.agentName -}}
{{- end -}}
{{- end -}}

{{/*
Checks across values that a JSON schema cannot express; each failure names the values.
The programs check the same again at start.
*/}}
{{/* Seconds in a duration string ("1h30m" -> 5400), as a string: float64 (include ...). */}}
{{- define "sandlot.seconds" -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h)" (toString .) -1 -}}
{{- $unit := regexFind "(ms|s|m|h)$" . -}}
{{- $n := float64 (trimSuffix $unit .) -}}
{{- $scale := get (dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0) $unit -}}
{{- $total = addf $total (mulf $n $scale) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{- define "sandlot.validate" -}}
{{- $a := .Values.agent -}}
{{- if ge (float64 (include "sandlot.seconds" $a.renewInterval)) (float64 (include "sandlot.seconds" $a.leaseDuration)) -}}
{{- fail (printf "agent.renewInterval (%s) must be below agent.leaseDuration (%s)" $a.renewInterval $a.leaseDuration) -}}
{{- end -}}
{{- $le := .Values.operator.leaderElection -}}
{{- $retry := float64 (include "sandlot.seconds" $le.retryPeriod) -}}
{{- $renew := float64 (include "sandlot.seconds" $le.renewDeadline) -}}
{{- $lease := float64 (include "sandlot.seconds" $le.leaseDuration) -}}
{{- if not (and (lt $retry $renew) (lt $renew $lease)) -}}
{{- fail (printf "operator.leaderElection: retryPeriod (%s) < renewDeadline (%s) < leaseDuration (%s) must hold" $le.retryPeriod $le.renewDeadline $le.leaseDuration) -}}
{{- end -}}
{{- $dt := float64 .Values.operator.disruptionThreshold -}}
{{- if or (le $dt 0.0) (gt $dt 1.0) -}}
{{- fail (printf "operator.disruptionThreshold (%v) must be in (0, 1]" .Values.operator.disruptionThreshold) -}}
{{- end -}}
{{- $gc := .Values.agent.gc -}}
{{- range $k := list "highThresholdPercent" "lowThresholdPercent" -}}
{{- $v := float64 (get $gc $k) -}}
{{- if or (le $v 0.0) (gt $v 100.0) -}}
{{- fail (printf "agent.gc.%s (%v) must be in (0, 100]" $k (get $gc $k)) -}}
{{- end -}}
{{- end -}}
{{- if ge (float64 $gc.lowThresholdPercent) (float64 $gc.highThresholdPercent) -}}
{{- fail (printf "agent.gc.lowThresholdPercent (%v) must be below agent.gc.highThresholdPercent (%v)" $gc.lowThresholdPercent $gc.highThresholdPercent) -}}
{{- end -}}
{{- if and (gt (int64 $gc.targetFreeBytes) 0) (lt (int64 $gc.targetFreeBytes) (int64 $gc.minFreeBytes)) -}}
{{- fail (printf "agent.gc.targetFreeBytes (%v) must be >= agent.gc.minFreeBytes (%v) or 0 (off)" $gc.targetFreeBytes $gc.minFreeBytes) -}}
{{- end -}}
{{- if and .Values.operator.podDisruptionBudget.enabled (ge (int .Values.operator.podDisruptionBudget.minAvailable) (int .Values.operator.replicas)) (gt (int .Values.operator.replicas) 1) -}}
{{- fail (printf "operator.podDisruptionBudget.minAvailable (%v) must be below operator.replicas (%v), or no voluntary disruption could ever proceed" .Values.operator.podDisruptionBudget.minAvailable .Values.operator.replicas) -}}
{{- end -}}
{{- end -}}
