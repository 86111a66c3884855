{{/* Names, labels and the checks every render runs. */}}

{{- define "duet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "duet.fullname" -}}
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

{{- define "duet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "duet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "duet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "duet.labels" -}}
helm.sh/chart: {{ include "duet.chart" . }}
{{ include "duet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: duet
{{- end }}

{{- define "duet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "duet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "duet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The RBAC rules for the namespaced kinds duet watches, writes status of, or reports on. */}}
{{- define "duet.rules.namespaced" -}}
- apiGroups: [""]
  resources: ["services", "secrets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["ingresses"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["ingresses/status"]
  verbs: ["update", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* Gateway API (gatewayAPI.enabled), cluster-scoped part: GatewayClasses (read, status written)
and Namespaces (routes' allowedRoutes selectors). */}}
{{- define "duet.rules.gateway.cluster" -}}
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gatewayclasses"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gatewayclasses/status"]
  verbs: ["update", "patch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/* Gateway API (gatewayAPI.enabled), namespaced part: Gateways, routes, ReferenceGrants,
BackendTLSPolicies and ConfigMaps (their CA certificates) read and their status written, and one LoadBalancer Service with its EndpointSlices managed per
Gateway, in the Gateway's namespace. Granted in the watched namespaces only with
controller.watchNamespaces (duet's Gateway watches are narrowed to them too). */}}
{{- define "duet.rules.gateway.namespaced" -}}
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gateways", "httproutes", "grpcroutes", "tlsroutes", "referencegrants", "backendtlspolicies", "listenersets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gateways/status", "httproutes/status", "grpcroutes/status", "tlsroutes/status", "backendtlspolicies/status", "listenersets/status"]
  verbs: ["update", "patch"]
- apiGroups: [""]
  resources: ["services", "secrets", "configmaps"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch", "update", "delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
{{- end }}

{{/* The leader-election Lease: one per release, so two releases in a namespace do not share it. */}}
{{- define "duet.leaseName" -}}
{{ include "duet.fullname" . }}-leader
{{- end }}

{{/* The namespace of controller.defaultTLSSecret when duet does not watch it, else empty. */}}
{{- define "duet.unwatchedTLSSecretNamespace" -}}
{{- $c := .Values.controller }}
{{- if and $c.defaultTLSSecret $c.watchNamespaces }}
{{- $ns := first (splitList "/" $c.defaultTLSSecret) }}
{{- if not (has $ns $c.watchNamespaces) }}{{ $ns }}{{ end }}
{{- end }}
{{- end }}

{{/* Whether the metrics Service is rendered. */}}
{{- define "duet.metricsService" -}}
{{- if or .Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled }}true{{ end }}
{{- end }}

{{/* Checks of combinations the schema cannot express; a bad combination fails the render. */}}
{{- define "duet.validate" -}}
{{- $svc := .Values.service }}
{{- $n := len $svc.ipFamilies }}
{{- if and (eq $svc.ipFamilyPolicy "SingleStack") (gt $n 1) }}
{{- fail (printf "service.ipFamilyPolicy SingleStack takes at most one entry in service.ipFamilies, got %d" $n) }}
{{- end }}
{{- if and (eq $svc.ipFamilyPolicy "RequireDualStack") (eq $n 1) }}
{{- fail "service.ipFamilyPolicy RequireDualStack needs both IPv4 and IPv6 in service.ipFamilies (or none: the cluster's order)" }}
{{- end }}
{{- $c := .Values.controller }}
{{- /* duet flushes its access log for at most 2 s after draining. */}}
{{- $needed := add $c.preStopSleepSeconds $c.shutdownDelaySeconds $c.drainSeconds 2 }}
{{- if le (int $c.terminationGracePeriodSeconds) (int $needed) }}
{{- fail (printf "controller.terminationGracePeriodSeconds (%v) must exceed preStopSleepSeconds + shutdownDelaySeconds + drainSeconds + 2 s of access-log flush (%v), or the kubelet kills duet mid-drain" $c.terminationGracePeriodSeconds $needed) }}
{{- end }}
{{- $a := .Values.autoscaling }}
{{- if $a.enabled }}
{{- if eq $c.kind "DaemonSet" }}
{{- fail "autoscaling.enabled needs controller.kind Deployment" }}
{{- end }}
{{- if gt (int $a.minReplicas) (int $a.maxReplicas) }}
{{- fail (printf "autoscaling.minReplicas (%v) must not exceed autoscaling.maxReplicas (%v)" $a.minReplicas $a.maxReplicas) }}
{{- end }}
{{- if not (or $a.targetCPUUtilizationPercentage $a.targetMemoryUtilizationPercentage) }}
{{- fail "autoscaling.enabled needs a metric: set autoscaling.targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage above 0" }}
{{- end }}
{{- end }}
{{- if and .Values.controller.publishService.enabled (not .Values.service.enabled) (not .Values.controller.publishStatusAddresses) }}
{{- fail "controller.publishService.enabled needs service.enabled (or set controller.publishStatusAddresses, or turn publishService off)" }}
{{- end }}
{{- end }}

{{/* The `duet serve` arguments. */}}
{{- define "duet.args" -}}
- "serve"
{{- range .Values.controller.listenAddresses }}
- "--http-listen={{ . }}:{{ $.Values.controller.containerPorts.http }}"
- "--https-listen={{ . }}:{{ $.Values.controller.containerPorts.https }}"
- "--admin-listen={{ . }}:{{ $.Values.controller.containerPorts.admin }}"
{{- end }}
- "--ingress-class={{ include "duet.ingressClassName" . }}"
- "--controller-name={{ include "duet.controllerName" . }}"
- "--upstream-family={{ .Values.controller.upstreamFamily }}"
- "--lb={{ .Values.controller.lb }}"
{{- if .Values.controller.watchIngressWithoutClass }}
- "--watch-ingress-without-class"
{{- end }}
{{- range .Values.controller.watchNamespaces }}
- "--watch-namespace={{ . }}"
{{- end }}
- "--election-namespace={{ .Release.Namespace }}"
- "--election-id={{ include "duet.leaseName" . }}"
{{- if .Values.controller.publishStatusAddresses }}
- "--publish-status-address={{ join "," .Values.controller.publishStatusAddresses }}"
{{- else if .Values.controller.publishService.enabled }}
- "--publish-service={{ .Release.Namespace }}/{{ include "duet.fullname" . }}"
{{- end }}
- "--access-log={{ .Values.controller.accessLog }}"
{{- with .Values.controller.defaultTLSSecret }}
- "--default-tls-secret={{ . }}"
{{- end }}
{{- with .Values.controller.proxyProtocol }}
- "--proxy-protocol={{ . }}"
{{- end }}
{{- with .Values.controller.trustedProxies }}
- "--trusted-proxies={{ join "," . }}"
{{- end }}
{{- with .Values.controller.authAllowedDestinations }}
- "--auth-allowed-destinations={{ join "," . }}"
{{- end }}
{{- with .Values.controller.proxyProtocolFrom }}
- "--proxy-protocol-from={{ join "," . }}"
{{- end }}
{{- if .Values.http3.enabled }}
- "--http3"
- "--http3-alt-svc-max-age={{ .Values.http3.altSvcMaxAge }}"
{{- end }}
- "--shutdown-delay={{ .Values.controller.shutdownDelaySeconds }}s"
- "--drain-timeout={{ .Values.controller.drainSeconds }}s"
{{- if .Values.gatewayAPI.enabled }}
- "--gateway-pod-selector={{ include "duet.selectorLabels" . | replace ": " "=" | replace "\n" "," }}"
{{- end }}
{{- if .Values.controller.strictAnnotations }}
- "--strict-annotations"
{{- end }}
{{- if .Values.controller.enableSslPassthrough }}
- "--enable-ssl-passthrough"
{{- end }}
- "--canary-scope={{ .Values.controller.canaryScope }}"
{{- range .Values.controller.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* The IngressClass name: `nginx` under `compat: ingress-nginx`, else ingressClass.name. */}}
{{- define "duet.ingressClassName" -}}
{{- if eq .Values.compat "ingress-nginx" }}nginx{{ else }}{{ .Values.ingressClass.name }}{{ end }}
{{- end }}

{{/* `--controller-name`: ingress-nginx's under `compat: ingress-nginx`. */}}
{{- define "duet.controllerName" -}}
{{- if eq .Values.compat "ingress-nginx" }}k8s.io/ingress-nginx{{ else }}{{ .Values.controller.controllerName }}{{ end }}
{{- end }}
