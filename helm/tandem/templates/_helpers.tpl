{{/*
Names, labels and the pieces every role's pod shares. The ports are those of
the local stack: gateway 7700, verifier 7710, drafter 7720; each role's health
port is one above, its metrics port two above.
*/}}

{{- define "tandem.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tandem.port" -}}
{{- $base := dict "gateway" 7700 "verifier" 7710 "drafter" 7720 -}}
{{- get $base .role -}}
{{- end -}}

{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "tandem.labels" -}}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "tandem.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "tandem.gatewayAddress" -}}
{{- printf "%s-gateway:%d" (include "tandem.fullname" .) (int .Values.gateway.service.port) -}}
{{- end -}}

{{- define "tandem.tokenizer" -}}
{{- default (printf "%s/tokenizer.json" .Values.models.target) .Values.models.tokenizer -}}
{{- end -}}

{{- define "tandem.onoff" -}}
{{- if . }}on{{ else }}off{{ end -}}
{{- end -}}

{{/*
The compatibility rules, checked before anything is rendered. Each message
is the one the services and `tandem check-config` give for the same rule,
with the values keys in place of the config files.
*/}}
{{- define "tandem.validate" -}}
{{- $v := .Values -}}
{{- $s := $v.speculative -}}
{{- $name := include "tandem.fullname" . -}}
{{- if gt (int $s.blockSize) (int $s.maxDraftTokens) -}}
{{- fail (printf "rule draft-block-size: drafter %s-drafter proposes blocks of %d tokens (draft_block_size, values speculative.blockSize) but verifier %s-verifier verifies at most %d draft tokens per round (max_draft_tokens, values speculative.maxDraftTokens); a block must hold 1 to max_draft_tokens drafts." $name (int $s.blockSize) $name (int $s.maxDraftTokens)) -}}
{{- end -}}
{{- if and $s.prefixCache (eq $s.stateStrategy "no_buffer") -}}
{{- fail "prefix_cache=on (values speculative.prefixCache) conflicts with state_strategy=no_buffer (values speculative.stateStrategy): prefix caching takes the recurrent state at block boundaries inside verified draft blocks, which no_buffer cannot produce (it keeps only a checkpoint from before the block); set state_strategy to extra_buffer or replay (or auto), or prefix_cache to off (check prefix-cache-needs-state)" -}}
{{- end -}}
{{- if and (eq $s.drafterKind "model") (not $v.models.draft) -}}
{{- fail "drafter_kind=model (values speculative.drafterKind) needs a draft model, but model='' (values models.draft); set model to a model directory or drafter_kind to ngram (check model-drafter-needs-model)" -}}
{{- end -}}
{{- if not $v.models.target -}}
{{- fail "model='' (values models.target): a verifier serves a target model; set model to a model directory (check verifier-needs-model)" -}}
{{- end -}}
{{- if and (not $v.clusterToken.enabled) (not (and $v.tls.enabled $v.tls.mutual)) -}}
{{- fail "clusterToken.enabled=false without mutual TLS (tls.enabled and tls.mutual): the services then accept calls between them (Registry, Run, Draft) only from their own host, which no other pod is; enable clusterToken or mutual TLS" -}}
{{- end -}}
{{- if and $v.tls.enabled (not $v.tls.certManager.enabled) -}}
{{- range $role := list "gateway" "verifier" "drafter" -}}
{{- if not (get $v.tls.secrets $role) -}}
{{- fail (printf "tls.enabled needs a Secret per role: set tls.secrets.%s (keys tls.crt, tls.key, ca.crt) or tls.certManager.enabled" $role) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.tls.certManager.enabled (not $v.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.enabled needs tls.certManager.issuerRef.name (the Issuer or ClusterIssuer that signs the roles' certificates)" -}}
{{- end -}}
{{- if and $s.draftVocab (eq $s.drafterKind "ngram") -}}
{{- fail (printf "draft_vocab (values speculative.draftVocab) is set, but drafter_kind=%s (values speculative.drafterKind) drafts without an LM head to restrict; unset draft_vocab or set drafter_kind to model or mtp (check draft-vocab-needs-lm-head)" $s.drafterKind) -}}
{{- end -}}
{{- if and (eq $v.drafter.weights "fp8") (eq $s.drafterKind "ngram") -}}
{{- fail (printf "weights=fp8 (values drafter.weights) rounds a drafter's matrices, but drafter_kind=%s (values speculative.drafterKind) drafts without any; unset weights or set drafter_kind to model or mtp (check fp8-weights-need-matrices)" $s.drafterKind) -}}
{{- end -}}
{{- if and (eq $s.featureTransport "shm") (ne $v.drafter.mode "colocated") -}}
{{- fail "feature_transport=shm (values speculative.featureTransport) needs drafter.mode=colocated: a remote drafter's pod has its own /dev/shm, so the verifier's shared-memory ring cannot reach it; set featureTransport to grpc or auto (or empty: the chart picks), or drafter.mode to colocated" -}}
{{- end -}}
{{- if and (eq $s.exchangeTransport "shm") (ne $v.drafter.mode "colocated") -}}
{{- fail "exchange_transport=shm (values speculative.exchangeTransport) needs drafter.mode=colocated: a remote drafter's pod has its own /dev/shm, so the verifier's shared-memory exchange lane cannot reach it and every Draft stream would break; set exchangeTransport to grpc or auto (or empty: the chart picks), or drafter.mode to colocated" -}}
{{- end -}}
{{- if and (eq $v.drafter.mode "colocated") $v.drafter.autoscaling.enabled -}}
{{- fail "drafter.autoscaling.enabled with drafter.mode=colocated: a colocated drafter is a container of each verifier pod and scales with verifier.autoscaling" -}}
{{- end -}}
{{- $tp := int $v.verifier.tensorParallel -}}
{{- if or (lt $tp 1) (gt $tp 8) -}}
{{- fail (printf "verifier.tensorParallel=%d: tensor_parallel takes 1 to 8 ranks" $tp) -}}
{{- end -}}
{{- if and (gt $tp 1) (gt (int $v.verifier.gpus) 0) (ne (int $v.verifier.gpus) $tp) -}}
{{- fail (printf "verifier.gpus=%d with verifier.tensorParallel=%d: a tensor-parallel verifier on GPUs runs one rank a GPU; set gpus to %d, or to 0 with backend cuda (the chart then requests %d)" (int $v.verifier.gpus) $tp $tp $tp) -}}
{{- end -}}
{{- if and (eq $v.models.source "pvc") (not $v.models.pvc.claimName) -}}
{{- fail "models.source=pvc needs models.pvc.claimName" -}}
{{- end -}}
{{- if and (eq $v.models.source "imageVolume") (not $v.models.imageVolume.reference) -}}
{{- fail "models.source=imageVolume needs models.imageVolume.reference" -}}
{{- end -}}
{{- /* Keys the chart sets from one place may not be set again per role. */ -}}
{{- $owned := dict "state_strategy" "speculative.stateStrategy" "prefix_cache" "speculative.prefixCache" "draft_block_size" "speculative.blockSize" "max_draft_tokens" "speculative.maxDraftTokens" "drafter_kind" "speculative.drafterKind" "model" "models.target / models.draft" "tokenizer" "models.tokenizer" "gateway" "(the chart: the gateway Service)" "listen" "(the chart: the role's port)" "health_listen" "(the chart: the role's port + 1)" "metrics_listen" "common.metrics" "advertise" "(the chart: the pod's IP)" "tls_cert" "tls" "tls_key" "tls" "tls_ca" "tls" "tls_client_auth" "tls.mutual" "cluster_token_file" "clusterToken" "log_level" "common.logLevel" "shutdown_grace" "common.shutdownGraceSeconds" "max_sequences" "verifier/drafter.maxSequences" "tensor_parallel" "verifier.tensorParallel" "backend" "verifier/drafter.backend" "feature_transport" "speculative.featureTransport" "exchange_transport" "speculative.exchangeTransport" -}}
{{- range $role := list "gateway" "verifier" "drafter" -}}
{{- range $key, $_ := (get $v $role).config -}}
{{- if hasKey $owned $key -}}
{{- fail (printf "%s.config.%s: %s is set by the chart from %s, so that every role reads it from one place; set it there" $role $key $key (get $owned $key)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* One `key: value` line of a config file; booleans as on/off. */}}
{{- define "tandem.cfgline" -}}
{{- if kindIs "bool" .value -}}
{{ .key }}: {{ include "tandem.onoff" .value }}
{{- else -}}
{{ .key }}: {{ toString .value | quote }}
{{- end -}}
{{- end -}}

{{/* What every role's config file starts with. */}}
{{- define "tandem.cfgcommon" -}}
{{- $v := .root.Values -}}
{{- $port := int (include "tandem.port" .) -}}
listen: "0.0.0.0:{{ $port }}"
health_listen: "0.0.0.0:{{ add $port 1 }}"
metrics_listen: {{ if $v.common.metrics }}"0.0.0.0:{{ add $port 2 }}"{{ else }}""{{ end }}
log_level: {{ $v.common.logLevel | quote }}
shutdown_grace: "{{ int $v.common.shutdownGraceSeconds }}s"
{{- if $v.clusterToken.enabled }}
cluster_token_file: "/etc/tandem/token/token"
{{- end }}
{{- if $v.tls.enabled }}
tls_cert: "/etc/tandem/tls/tls.crt"
tls_key: "/etc/tandem/tls/tls.key"
tls_ca: "/etc/tandem/tls/ca.crt"
tls_client_auth: {{ if $v.tls.mutual }}"require"{{ else }}"none"{{ end }}
{{- end }}
{{- end -}}

{{/* The pod-level pieces: security context, volumes. */}}
{{- define "tandem.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "tandem.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "tandem.tlsSecret" -}}
{{- if .root.Values.tls.certManager.enabled -}}
{{- printf "%s-%s-tls" (include "tandem.fullname" .root) .role -}}
{{- else -}}
{{- get .root.Values.tls.secrets .role -}}
{{- end -}}
{{- end -}}

{{- define "tandem.tokenSecret" -}}
{{- default (printf "%s-cluster-token" (include "tandem.fullname" .)) .Values.clusterToken.existingSecret -}}
{{- end -}}

{{/* The feature stream's transport for drafterKind mtp (feature_transport):
speculative.featureTransport, or the chart's pick: shm for a colocated
drafter (the pod shares a memory-backed /dev/shm), grpc for remote ones. ""
for other kinds. */}}
{{- define "tandem.featureTransport" -}}
{{- $v := .Values -}}
{{- if eq $v.speculative.drafterKind "mtp" -}}
{{- if $v.speculative.featureTransport -}}
{{- $v.speculative.featureTransport -}}
{{- else -}}
{{- ternary "shm" "grpc" (eq $v.drafter.mode "colocated") -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Draft stream's transport (exchange_transport), for every drafter
kind: speculative.exchangeTransport, or the chart's pick: shm for a colocated
drafter (the pod shares a memory-backed /dev/shm), grpc for remote ones (their
pods have their own /dev/shm: shm could never work there, and auto would only
log a refused lane per stream). */}}
{{- define "tandem.exchangeTransport" -}}
{{- $v := .Values -}}
{{- if $v.speculative.exchangeTransport -}}
{{- $v.speculative.exchangeTransport -}}
{{- else -}}
{{- ternary "shm" "grpc" (eq $v.drafter.mode "colocated") -}}
{{- end -}}
{{- end -}}

{{/* "true" when the verifier pods mount a shared memory-backed /dev/shm: a
drafter colocated in them, with shm allowed for the exchange lane or (MTP)
the feature ring. */}}
{{- define "tandem.sharedShm" -}}
{{- $f := include "tandem.featureTransport" . -}}
{{- $x := include "tandem.exchangeTransport" . -}}
{{- if and (eq .Values.drafter.mode "colocated") (or (eq $f "shm") (eq $f "auto") (eq $x "shm") (eq $x "auto")) -}}true{{- end -}}
{{- end -}}

{{- define "tandem.volumes" -}}
{{- $v := .root.Values -}}
- name: config
  configMap:
    name: {{ include "tandem.fullname" .root }}-config
{{- if and (eq .role "verifier") (include "tandem.sharedShm" .root) }}
# The verifier's and its drafter's /dev/shm: one memory-backed emptyDir, so
# the exchange lanes (and, MTP, the feature ring) the verifier offers are the
# drafter's to map.
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ $v.drafter.shmSizeLimit }}
{{- end }}
{{- if $v.clusterToken.enabled }}
- name: cluster-token
  secret:
    secretName: {{ include "tandem.tokenSecret" .root }}
    defaultMode: 0440
{{- end }}
{{- if $v.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "tandem.tlsSecret" . }}
    defaultMode: 0440
{{- end }}
{{- if eq $v.models.source "pvc" }}
- name: models
  persistentVolumeClaim:
    claimName: {{ $v.models.pvc.claimName }}
    readOnly: true
{{- else if eq $v.models.source "imageVolume" }}
- name: models
  image:
    reference: {{ $v.models.imageVolume.reference }}
    pullPolicy: {{ $v.models.imageVolume.pullPolicy }}
{{- end }}
{{- end -}}

{{- define "tandem.volumeMounts" -}}
{{- $v := .Values -}}
- name: config
  mountPath: /etc/tandem/config
  readOnly: true
{{- if $v.clusterToken.enabled }}
- name: cluster-token
  mountPath: /etc/tandem/token
  readOnly: true
{{- end }}
{{- if $v.tls.enabled }}
- name: tls
  mountPath: /etc/tandem/tls
  readOnly: true
{{- end }}
{{- if ne $v.models.source "image" }}
- name: models
  mountPath: {{ $v.models.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/*
The address a replica tells its peers (advertise): its pod IP, or with TLS
its pod's DNS name under the role's headless Service (certificates cannot
name pod IPs ahead of time; they name *.SERVICE.NAMESPACE.svc).
*/}}
{{- define "tandem.advertise" -}}
{{- $port := int (include "tandem.port" .) -}}
{{- if .root.Values.tls.enabled -}}
{{- printf "$(POD_NAME).%s-%s.%s.svc:%d" (include "tandem.fullname" .root) .role .root.Release.Namespace $port -}}
{{- else -}}
{{- printf "$(POD_IP):%d" $port -}}
{{- end -}}
{{- end -}}

{{/* Environment: the pod's name and IP, and the address peers are told. */}}
{{- define "tandem.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- if .advertise }}
- name: TANDEM_ADVERTISE
  value: {{ .advertise | quote }}
{{- end }}
{{- end -}}

{{- define "tandem.resources" -}}
{{- $r := deepCopy (default dict .spec.resources) -}}
{{- if gt (int .spec.gpus) 0 -}}
{{- $limits := default dict $r.limits -}}
{{- $_ := set $limits "nvidia.com/gpu" (int .spec.gpus) -}}
{{- $_ := set $r "limits" $limits -}}
{{- end -}}
{{- if $r }}
{{- toYaml $r }}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/* gRPC probes on the plaintext health port. */}}
{{- define "tandem.probes" -}}
{{- $hp := add (int (include "tandem.port" .)) 1 -}}
{{- if .startup -}}
startupProbe:
  grpc:
    port: {{ $hp }}
  periodSeconds: {{ .startup.periodSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
{{ end -}}
readinessProbe:
  grpc:
    port: {{ $hp }}
  periodSeconds: 5
  failureThreshold: 2
livenessProbe:
  grpc:
    port: {{ $hp }}
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}

{{- define "tandem.ports" -}}
{{- $p := int (include "tandem.port" .) -}}
- name: grpc
  containerPort: {{ $p }}
- name: health
  containerPort: {{ add $p 1 }}
{{- if .root.Values.common.metrics }}
- name: metrics
  containerPort: {{ add $p 2 }}
{{- end }}
{{- end -}}

{{- define "tandem.podAnnotations" -}}
checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
{{- if and .root.Values.common.metrics .root.Values.common.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ add (int (include "tandem.port" .)) 2 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .spec.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "tandem.affinity" -}}
{{- $sel := include "tandem.selectorLabels" . | fromYaml -}}
{{- if .spec.affinity -}}
{{- toYaml .spec.affinity -}}
{{- else if eq .spec.antiAffinity "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- toYaml $sel | nindent 10 }}
{{- else if eq .spec.antiAffinity "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- toYaml $sel | nindent 12 }}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/*
A replica's container: role (verifier or drafter), spec (its values), extra
args, the address it advertises, and whether it is the check-config init
container (same image, config, environment, mounts and resources, so that it
checks what the service would see).
*/}}
{{- define "tandem.replicaContainer" -}}
{{- $v := .root.Values -}}
- name: {{ .name }}
  image: {{ include "tandem.image" .root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    {{- toYaml (concat (list .role "--config" (printf "/etc/tandem/config/%s.yaml" .role)) (default list .args) (ternary (list "--check-config") list (default false .check))) | nindent 4 }}
  env:
    {{- include "tandem.env" (dict "advertise" .advertise) | nindent 4 }}
  {{- if not .check }}
  ports:
    {{- include "tandem.ports" . | nindent 4 }}
  {{- include "tandem.probes" (dict "root" .root "role" .role "startup" .spec.startupProbe) | nindent 2 }}
  {{- end }}
  resources:
    {{- include "tandem.resources" . | nindent 4 }}
  securityContext:
    {{- include "tandem.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    {{- include "tandem.volumeMounts" .root | nindent 4 }}
    {{- if and (or (eq .role "verifier") (eq .role "drafter")) (include "tandem.sharedShm" .root) }}
    - name: dshm
      mountPath: /dev/shm
    {{- end }}
{{- end -}}
