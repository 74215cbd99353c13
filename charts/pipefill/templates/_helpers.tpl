{{/* Names, labels, the operator's RBAC rules and the checks of impossible values. */}}

{{- define "pipefill.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object name: the release name, plus the chart name unless the release name has it. */}}
{{- define "pipefill.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pipefill.operatorName" -}}
{{- printf "%s-operator" (include "pipefill.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object of the release. (The CRDs add app.kubernetes.io/part-of themselves.) */}}
{{- define "pipefill.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "pipefill.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selects the operator pod. The rank pods carry app.kubernetes.io/name: pipefill too, but no instance label. */}}
{{- define "pipefill.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pipefill.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "pipefill.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pipefill.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An endpoint on the pod IP: "host:port" for --metrics-address (split at the last colon, so an IPv6 address goes
bare), or a URL for --liveness (IPv6 in brackets).
*/}}
{{- define "pipefill.podAddress" -}}
{{- if and .url (eq .root.Values.operator.ipFamily "IPv6") -}}
http://[$(POD_IP)]:{{ .port }}
{{- else if .url -}}
http://$(POD_IP):{{ .port }}
{{- else -}}
$(POD_IP):{{ .port }}
{{- end -}}
{{- end -}}

{{/*
The operator's rules: operator/rbac/clusterrole.yaml (a link in files/), which the operator's RBAC test derives from
the audit log of a run that touches every kind of object. The chart never adds or drops a verb of its own.
*/}}
{{- define "pipefill.operatorRules" -}}
{{- $file := "files/operator-clusterrole.yaml" -}}
{{- $role := .Files.Get $file | fromYaml -}}
{{- if or (hasKey $role "Error") (not $role.rules) -}}
{{- fail (printf "ERROR: %s (a link to operator/rbac/clusterrole.yaml) is missing or has no rules; install the chart from the repository or a package built from it" $file) -}}
{{- end -}}
{{- toYaml $role.rules -}}
{{- end -}}

{{/*
Cluster-scoped resources the operator's rules may name; the rest are namespaced. tests/chart checks this against the
API server's discovery for every resource of the derived ClusterRole.
*/}}
{{- define "pipefill.clusterScopedResources" -}}
{{- toYaml (list "nodes" "deviceclasses" "namespaces" "persistentvolumes" "storageclasses" "priorityclasses" "resourceslices" "customresourcedefinitions") -}}
{{- end -}}

{{/*
Cluster-scoped reads the operator makes only when it serves all namespaces: the node watch (for the check that some
node offers the GPU resource) is registered only then (pipefill_operator.handlers).
*/}}
{{- define "pipefill.clusterwideOnlyResources" -}}
{{- toYaml (list "nodes") -}}
{{- end -}}

{{/*
The operator's rules restricted to namespaced resources (cluster: false) or to cluster-scoped ones (cluster: true),
for an install serving some namespaces only; the clusterwide-only resources are left out. A rule that keeps no
resource is dropped.
*/}}
{{- define "pipefill.scopedRules" -}}
{{- $clusterScoped := include "pipefill.clusterScopedResources" .root | fromYamlArray -}}
{{- $drop := include "pipefill.clusterwideOnlyResources" .root | fromYamlArray -}}
{{- $out := list -}}
{{- range $rule := include "pipefill.operatorRules" .root | fromYamlArray -}}
{{- $kept := list -}}
{{- range $resource := $rule.resources -}}
{{- $base := splitList "/" $resource | first -}}
{{- if and (eq (has $base $clusterScoped) $.cluster) (not (has $base $drop)) -}}
{{- $kept = append $kept $resource -}}
{{- end -}}
{{- end -}}
{{- if $kept -}}
{{- $out = append $out (merge (dict "resources" $kept) (omit $rule "resources")) -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Impossible or unsupported values, refused with the value, the rule and the fix. */}}
{{- define "pipefill.validate" -}}
{{- $op := .Values.operator -}}
{{- if gt (int $op.replicas) 1 -}}
{{- fail (printf "ERROR: operator.replicas=%v: the operator runs standalone (no kopf peering), so a second replica would reconcile every job twice; set operator.replicas to 1 (or 0 to pause)" $op.replicas) -}}
{{- end -}}
{{- if and $op.metrics.enabled $op.liveness.enabled (eq (int $op.metrics.port) (int $op.liveness.port)) -}}
{{- fail (printf "ERROR: operator.metrics.port and operator.liveness.port are both %v: two endpoints cannot bind one port; change one of them" $op.metrics.port) -}}
{{- end -}}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) -}}
{{- fail "ERROR: serviceAccount.create=false needs serviceAccount.name, the existing ServiceAccount the operator runs as; set it, or set serviceAccount.create=true" -}}
{{- end -}}
{{- if and .Values.monitoring.serviceMonitor.enabled (not $op.metrics.enabled) -}}
{{- fail "ERROR: monitoring.serviceMonitor.enabled=true needs operator.metrics.enabled=true (the ServiceMonitor scrapes the metrics Service); enable the metrics or disable the ServiceMonitor" -}}
{{- end -}}
{{- if and (or .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled .Values.monitoring.prometheusRule.enabled) (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) -}}
{{- fail "ERROR: monitoring.serviceMonitor.enabled, monitoring.podMonitor.enabled or monitoring.prometheusRule.enabled needs the Prometheus Operator's API monitoring.coreos.com/v1, which this cluster does not serve; install the Prometheus Operator first, or disable the monitors (with helm template, pass --api-versions monitoring.coreos.com/v1)" -}}
{{- end -}}
{{- end -}}
