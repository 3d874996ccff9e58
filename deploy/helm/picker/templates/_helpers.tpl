{{/*
Names. The pool is "<name>", every EPP object "<name>-epp" (as the reference chart), where <name> is
fullnameOverride or the release name, cut so "<name>-epp" fits the 63-character label limit.
*/}}
{{- define "picker.name" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 59 | trimSuffix "-" -}}
{{- end -}}

{{- define "picker.eppName" -}}
{{- printf "%s-epp" (include "picker.name" .) -}}
{{- end -}}

{{- define "picker.poolName" -}}
{{- default (include "picker.name" .) .Values.inferencePool.name -}}
{{- end -}}

{{/* API group of the InferencePool (--pool-group, and the group the Role grants inferencepools in). */}}
{{- define "picker.poolGroup" -}}
{{- first (splitList "/" .Values.inferencePool.apiVersion) -}}
{{- end -}}

{{- define "picker.serviceAccountName" -}}
{{- default (include "picker.eppName" .) .Values.inferenceExtension.serviceAccount.name -}}
{{- end -}}

{{- define "picker.selectorLabels" -}}
app.kubernetes.io/name: picker
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{- define "picker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "picker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "picker.image" -}}
{{- $img := .Values.inferenceExtension.image -}}
{{- $tag := default .Chart.AppVersion $img.tag -}}
{{- if $img.registry -}}
{{- printf "%s/%s:%s" $img.registry $img.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Leader election (active-passive) is on exactly when there is more than one replica. */}}
{{- define "picker.leaderElection" -}}
{{- if and (gt (int .Values.inferenceExtension.replicas) 1) (not .Values.inferenceExtension.activeActive) -}}true{{- end -}}
{{- end -}}

{{/* gRPC health service names the probes ask for (protocol.md §11). */}}
{{- define "picker.livenessService" -}}
{{- if include "picker.leaderElection" . -}}liveness{{- else -}}inference-extension{{- end -}}
{{- end -}}

{{- define "picker.readinessService" -}}
{{- if include "picker.leaderElection" . -}}readiness{{- else -}}inference-extension{{- end -}}
{{- end -}}

{{/*
Checks the JSON schema cannot express: cross-key rules. Included once from the Deployment.
*/}}
{{- define "picker.validate" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- if and (not (has $ie.pluginsConfigFile (list "default-plugins.yaml" "reference-plugins.yaml"))) (not (hasKey $ie.pluginsCustomConfig $ie.pluginsConfigFile)) -}}
{{- fail (printf "inferenceExtension.pluginsConfigFile %q is neither default-plugins.yaml, reference-plugins.yaml nor a key of inferenceExtension.pluginsCustomConfig" $ie.pluginsConfigFile) -}}
{{- end -}}
{{- if eq (include "picker.poolGroup" .) "inference.networking.x-k8s.io" -}}
{{- if gt (len .Values.inferencePool.targetPorts) 1 -}}
{{- fail "inferencePool.targetPorts: an inference.networking.x-k8s.io/v1alpha2 pool has one port (targetPortNumber); use apiVersion inference.networking.k8s.io/v1 for several" -}}
{{- end -}}
{{- if .Values.inferencePool.appProtocol -}}
{{- fail "inferencePool.appProtocol: an inference.networking.x-k8s.io/v1alpha2 pool has no appProtocol; use apiVersion inference.networking.k8s.io/v1" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.inferencePool.create (not .Values.inferencePool.modelServers.matchLabels) -}}
{{- fail "inferencePool.modelServers.matchLabels is required when inferencePool.create is true: the labels of your model-server pods" -}}
{{- end -}}
{{- if and (gt (int $ie.workers) 1) (or $ie.activeActive (include "picker.leaderElection" .)) -}}
{{- fail (printf "inferenceExtension.workers %d needs one pod without activeActive: workers are each other's peers inside the pod, and picker refuses them with leader election or peers in other pods" (int $ie.workers)) -}}
{{- end -}}
{{- $pdb := $ie.podDisruptionBudget -}}
{{- if $pdb.enabled -}}
{{- if and (not (kindIs "invalid" $pdb.minAvailable)) (not (kindIs "invalid" $pdb.maxUnavailable)) -}}
{{- fail "inferenceExtension.podDisruptionBudget: set minAvailable or maxUnavailable, not both (null the other)" -}}
{{- end -}}
{{- if include "picker.leaderElection" . -}}
{{- fail (printf "inferenceExtension.podDisruptionBudget: with %d replicas (leader election) only the leader is Ready, so a PodDisruptionBudget would block every drain of the leader's node (evictions never allowed); leave it off: an evicted leader releases its Lease and a standby takes over" (int $ie.replicas)) -}}
{{- end -}}
{{- if and (eq (int $ie.replicas) 1) (eq (include "picker.pdbMinAvailable" .) "1") -}}
{{- fail "inferenceExtension.podDisruptionBudget.minAvailable 1 with 1 replica would block every node drain; raise replicas or use maxUnavailable" -}}
{{- end -}}
{{- end -}}
{{- if and (include "picker.leaderElection" .) (eq $ie.strategy.type "RollingUpdate") -}}
{{- /* Only the leader is Ready: new pods (standbys) never turn Ready while an old leader runs, so a rolling update
that must keep an old pod until new ones are Ready never finishes. Only maxUnavailable >= replicas avoids that. */ -}}
{{- $maxUnavailable := "25%" -}}
{{- with $ie.strategy.rollingUpdate -}}{{- if hasKey . "maxUnavailable" -}}{{- $maxUnavailable = .maxUnavailable -}}{{- end -}}{{- end -}}
{{- $all := false -}}
{{- if kindIs "string" $maxUnavailable -}}
{{- $all = eq $maxUnavailable "100%" -}}
{{- else -}}
{{- $all = ge (int $maxUnavailable) (int $ie.replicas) -}}
{{- end -}}
{{- if not $all -}}
{{- fail (printf "inferenceExtension.strategy: with %d replicas (leader election) only the leader is Ready, so a RollingUpdate with maxUnavailable %v never finishes; use type Recreate, or RollingUpdate with rollingUpdate.maxUnavailable: 100%% (docs/kubernetes.md, Rollouts)" (int $ie.replicas) $maxUnavailable) -}}
{{- end -}}
{{- end -}}
{{- if $ie.activeActive -}}
{{- if and $ie.secureServing (not $ie.certSecretName) -}}
{{- fail "inferenceExtension.activeActive needs inferenceExtension.certSecretName: the replicas authenticate each other with the key pair they share (a kubernetes.io/tls Secret); without one each replica's certificate is its own (docs/ha.md)" -}}
{{- end -}}
{{- if and (gt (int $ie.replicas) 1) (eq $ie.strategy.type "Recreate") -}}
{{- fail "inferenceExtension.activeActive: strategy Recreate stops every replica at once; use type RollingUpdate (rollingUpdate: {maxSurge: 1, maxUnavailable: 0}) so replicas keep serving through a rollout" -}}
{{- end -}}
{{- end -}}
{{- $owned := list "peers" "peer-service" "peer-port" "pool-name" "pool-namespace" "pool-group" "grpc-port" "grpc-health-port" "metrics-port" "config-file" "config-text" "secure-serving" "cert-path" "ha-enable-leader-election" "zap-encoder" "endpoints" "endpoint-selector" "endpoint-target-ports" -}}
{{- range $name, $_ := $ie.flags -}}
{{- if has $name $owned -}}
{{- fail (printf "inferenceExtension.flags.%s is set by the chart; use its own value key instead (docs/install-helm.md)" $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The PodDisruptionBudget's minAvailable: the value set, or 1 when neither bound is set; "" with maxUnavailable. */}}
{{- define "picker.pdbMinAvailable" -}}
{{- $pdb := .Values.inferenceExtension.podDisruptionBudget -}}
{{- if not (kindIs "invalid" $pdb.minAvailable) -}}{{ $pdb.minAvailable }}
{{- else if kindIs "invalid" $pdb.maxUnavailable -}}1
{{- end -}}
{{- end -}}

{{/* The reference default plugins, with the engine so picker reads the right metric names. */}}
{{/*
picker's built-in default (files/default-plugins.yaml links to picker/scheduling/default-plugins.yaml: one source
for `picker serve` and the chart), its metrics extractor told the pool's engine.
*/}}
{{- define "picker.defaultPlugins" -}}
{{- $engine := printf "- type: core-metrics-extractor\n  parameters:\n    defaultEngine: %s\n" .Values.inferencePool.modelServerType -}}
{{- .Files.Get "files/default-plugins.yaml" | replace "- type: core-metrics-extractor\n" $engine | trimSuffix "\n" -}}
{{- end -}}

{{/* The reference EPP's default profile (queue 2, KV cache 2, prefix 3): pluginsConfigFile: reference-plugins.yaml */}}
{{- define "picker.referencePlugins" -}}
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
- type: core-metrics-extractor
  parameters:
    defaultEngine: {{ .Values.inferencePool.modelServerType }}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
{{- end -}}
