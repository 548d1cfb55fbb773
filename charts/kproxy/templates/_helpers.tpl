{{/*
The labels of every object's metadata: deploy/'s two (app.kubernetes.io/name
and part-of), then Helm's bookkeeping ones. Call with (list $ "NAME").
*/}}
{{- define "kproxy.labels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ index . 1 }}
app.kubernetes.io/part-of: kproxy
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version }}
{{- end -}}

{{- define "kproxy.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}

{{/* The KubeProxyConfiguration of an OS: config, then the OS's config over it, then what the chart sets. Call with (list $ "linux"|"windows"). */}}
{{- define "kproxy.proxyConfig" -}}
{{- $root := index . 0 -}}
{{- $os := index . 1 -}}
{{- $v := index $root.Values $os -}}
{{- $c := mergeOverwrite (deepCopy ($root.Values.config | default dict)) (deepCopy ($v.config | default dict)) -}}
{{- if eq $os "windows" -}}
{{- $_ := set $c "winkernel" (mergeOverwrite (deepCopy $v.network) ($c.winkernel | default dict)) -}}
{{- end -}}
{{- $cc := $c.clientConnection | default dict -}}
{{- $_ := set $cc "kubeconfig" "/var/lib/kproxy/kubeconfig.conf" -}}
{{- $_ := set $c "clientConnection" $cc -}}
{{- $_ := set $c "apiVersion" "kubeproxy.config.k8s.io/v1alpha1" -}}
{{- $_ := set $c "kind" "KubeProxyConfiguration" -}}
{{- $_ := set $c "mode" $v.mode -}}
{{ toYaml $c }}
{{- end -}}

{{/* The ConfigMap's data (kproxy's and the cleanup's). */}}
{{- define "kproxy.configData" -}}
kubeconfig.conf: |
  # How kproxy reaches the API server (the chart's apiServer value). Not the
  # in-cluster configuration: that names the kubernetes Service's ClusterIP,
  # which only works once a proxy has programmed it.
  apiVersion: v1
  kind: Config
  clusters:
  - name: default
    cluster:
      server: {{ .Values.apiServer | quote }}
      certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
  contexts:
  - name: default
    context:
      cluster: default
      namespace: {{ .Release.Namespace }}
      user: default
  current-context: default
  users:
  - name: default
    user:
      tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
linux.yaml: |
  # kproxy on Linux nodes (the chart's config and linux.config values).
{{ include "kproxy.proxyConfig" (list . "linux") | indent 2 }}
windows.yaml: |
  # kproxy on Windows nodes (the chart's config, windows.network and
  # windows.config values).
{{ include "kproxy.proxyConfig" (list . "windows") | indent 2 }}
{{- end -}}

{{/*
The ConfigMap's name: NAME-HASH, the hash from its data, as kustomize's
configMapGenerator names deploy/'s: a configuration change makes a new
ConfigMap, so the DaemonSets roll node by node (kproxy exits when the file
it runs with changes: under a fixed name every node would restart at once).
*/}}
{{- define "kproxy.configMapName" -}}
{{- $root := index . 0 -}}
{{ index . 1 }}-{{ include "kproxy.configData" $root | sha256sum | trunc 10 }}
{{- end -}}

{{/* Checks of value combinations the schema cannot express. */}}
{{- define "kproxy.validate" -}}
{{- if and .Values.cleanup.enabled (or .Values.linux.enabled .Values.windows.enabled) -}}
{{- fail "cleanup.enabled needs linux.enabled=false and windows.enabled=false: the cleanup would remove what kproxy programs while it runs (docs/install.md, \"Roll back to kube-proxy\")" -}}
{{- end -}}
{{- if or .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled -}}
{{- $addr := .Values.config.metricsBindAddress | default "127.0.0.1:10249" -}}
{{- if or (hasPrefix "127." $addr) (hasPrefix "[::1]" $addr) (hasPrefix "localhost" $addr) -}}
{{- fail (printf "metrics.serviceMonitor/podMonitor need config.metricsBindAddress on 0.0.0.0 (or the node's address), not %s: Prometheus cannot scrape a loopback address" $addr) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The port of a bind address (list ADDRESS DEFAULTPORT): a bare IP gets the default, as kproxy does. */}}
{{- define "kproxy.port" -}}
{{- $addr := index . 0 | default "" -}}
{{- $m := regexFind ":[0-9]+$" $addr -}}
{{- if $m }}{{ trimPrefix ":" $m }}{{ else }}{{ index . 1 }}{{ end -}}
{{- end -}}

{{/* The health and metrics ports, probes of kproxy's container (both OSes). */}}
{{- define "kproxy.portsAndProbes" -}}
{{- $healthz := include "kproxy.port" (list .Values.config.healthzBindAddress 10256) | int -}}
{{- $metrics := include "kproxy.port" (list .Values.config.metricsBindAddress 10249) | int -}}
ports:
- name: healthz
  containerPort: {{ $healthz }}
  protocol: TCP
- name: metrics
  containerPort: {{ $metrics }}
  protocol: TCP
# /livez: the proxy programs what was queued within 2x syncPeriod.
livenessProbe:
  httpGet:
    path: /livez
    port: {{ $healthz }}
  initialDelaySeconds: 15
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
# /healthz: as /livez, and 503 while this node is being deleted or drained
# by the cluster autoscaler.
readinessProbe:
  httpGet:
    path: /healthz
    port: {{ $healthz }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{- define "kproxy.nodeEnv" -}}
env:
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end -}}

{{/* The start of a Windows HostProcess container's command: start.ps1 in the image. */}}
{{- define "kproxy.windowsStart" -}}
command:
- powershell.exe
- -NoLogo
- -NoProfile
- -NonInteractive
- -ExecutionPolicy
- Bypass
- -Command
- "& (Join-Path $env:CONTAINER_SANDBOX_MOUNT_POINT 'kproxy/start.ps1')"
{{- end -}}

{{- define "kproxy.windowsPodSecurity" -}}
securityContext:
  windowsOptions:
    hostProcess: true
    runAsUserName: "NT AUTHORITY\\system"
{{- end -}}

{{- define "kproxy.podCommon" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
hostNetwork: true
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 0 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}
