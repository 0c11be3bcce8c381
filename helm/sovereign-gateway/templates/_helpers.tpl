{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "sg.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "sg.fullname" -}}
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

{{- define "sg.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels shared by every object of the release. */}}
{{- define "sg.labels" -}}
helm.sh/chart: {{ include "sg.chart" . }}
app.kubernetes.io/name: {{ include "sg.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sovereign-gateway
{{- end }}

{{/* Selects every pod of the release (the default-deny policy uses it). */}}
{{- define "sg.releaseSelector" -}}
app.kubernetes.io/name: {{ include "sg.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selects the gateway pods. */}}
{{- define "sg.gatewaySelector" -}}
{{ include "sg.releaseSelector" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "sg.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sg.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference: repository@digest when a digest is given, else repository:tag. */}}
{{- define "sg.imageRef" -}}
{{- $img := .image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .appVersion $img.tag) -}}
{{- end -}}
{{- end }}

{{/*
Regions of the node affinity: allowed list plus explicitly added regions. With euOnly, an
allowed region is in the built-in EU list (files/eu-regions.yaml, the list of
values.schema.json $defs/euRegion) or named in additionalRegions with a reason (an operator's own data
centre, a sovereign provider's region the list does not know): no built-in region is forced.
*/}}
{{- define "sg.regions" -}}
{{- $sov := .Values.sovereignty -}}
{{- $added := list -}}
{{- range $sov.additionalRegions }}{{ $added = append $added .name }}{{ end -}}
{{- if $sov.euOnly -}}
{{- $eu := (.Files.Get "files/eu-regions.yaml" | fromYaml).regions -}}
{{- range $sov.allowedRegions -}}
{{- if not (or (has . $eu) (has . $added)) -}}
{{- fail (printf "sovereignty.allowedRegions: %q is not in the built-in EU region list (values.schema.json $defs/euRegion); if it is in the EU (your own data centre, a sovereign provider), add {name: %s, reason: ...} to sovereignty.additionalRegions, or set sovereignty.euOnly: false" . .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $regions := concat $sov.allowedRegions $added | uniq -}}
{{- if not $regions -}}
{{- fail "sovereignty.allowedRegions and sovereignty.additionalRegions are both empty: name at least one region the pods may run in" -}}
{{- end -}}
{{- toYaml $regions -}}
{{- end }}

{{/* Required node affinity pinning pods to the allowed regions. */}}
{{- define "sg.regionAffinity" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: {{ .Values.sovereignty.regionLabel }}
            operator: In
            values:
              {{- include "sg.regions" . | nindent 14 }}
{{- end }}

{{/* "true" when config.yaml and policy.yaml come from an existing ConfigMap or Secret. */}}
{{- define "sg.externalConfig" -}}
{{- if or .Values.gateway.existingConfigMap .Values.gateway.existingConfigSecret }}true{{ end -}}
{{- end }}

{{/* Name of the ConfigMap with config.yaml and policy.yaml. */}}
{{- define "sg.configMapName" -}}
{{- default (printf "%s-config" (include "sg.fullname" .)) .Values.gateway.existingConfigMap }}
{{- end }}

{{/* Name of the Service of one vLLM model. Args: root context, model. */}}
{{- define "sg.vllmName" -}}
{{- printf "%s-vllm-%s" (include "sg.fullname" .root) .model.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
egress.destinations minus the in-chart vLLM Services (ids vllm-<model name>, the destinations
the rendered config gives their replicas): those are allowed by pod selector, so the policy may
name them by hostname only. JSON {"items": [...]}.
*/}}
{{- define "sg.egressDestinations" -}}
{{- $inChart := list -}}
{{- if .Values.vllm.enabled }}{{ range .Values.vllm.models }}{{ $inChart = append $inChart (printf "vllm-%s" .name) }}{{ end }}{{ end -}}
{{- $out := list -}}
{{- range .Values.egress.destinations }}{{ if not (has .id $inChart) }}{{ $out = append $out . }}{{ end }}{{ end -}}
{{- toJson (dict "items" $out) -}}
{{- end }}

{{/* Gateway config.yaml (contract: gateway settings file). */}}
{{/* The gateway's telemetry: section (admin port for /metrics; OTLP only to a policy destination). */}}
{{- define "sg.telemetryConfig" -}}
admin:
  host: 0.0.0.0
  port: {{ int .Values.gateway.adminPort }}
{{- if .Values.telemetry.enabled }}
otlp_endpoint: {{ .Values.telemetry.endpoint | quote }}
otlp_endpoint_destination: {{ .Values.telemetry.destination | quote }}
{{- end }}
{{- end }}

{{/* Directory of config.yaml and policy.yaml in the gateway container. With reload.mode live
the config volume is mounted whole there (no subPath: the kubelet updates it in place). */}}
{{- define "sg.configDir" -}}
{{- if eq .Values.gateway.reload.mode "live" }}/etc/sovereign-gateway/config{{ else }}/etc/sovereign-gateway{{ end -}}
{{- end }}

{{/* The gateway's mcp: section from the chart's mcp: values (empty without servers). Each
server's upstream token is the file its credentials Secret is mounted as (deployment.yaml). */}}
{{- define "sg.mcpConfig" -}}
{{- if .Values.mcp.servers }}
{{- $servers := list -}}
{{- range .Values.mcp.servers }}
{{- $s := dict "name" .name "url" .url "destination" .destination -}}
{{- if .credentials }}{{ $_ := set $s "auth_token_file" (printf "/etc/sovereign-gateway/mcp/%s/token" .name) }}{{ end -}}
{{- with .scopes }}{{ $_ := set $s "scopes" . }}{{ end -}}
{{- with .tools }}{{ $_ := set $s "tools" . }}{{ end -}}
{{- with .flow }}{{ $_ := set $s "flow" . }}{{ end -}}
{{- $servers = append $servers $s -}}
{{- end }}
{{- $mcp := dict "servers" $servers "access" .Values.mcp.access "allowed_origins" .Values.mcp.allowedOrigins -}}
{{- with .Values.mcp.limits }}{{ $_ := set $mcp "limits" . }}{{ end -}}
{{- with .Values.mcp.resourceMetadata }}{{ $_ := set $mcp "resource_metadata" . }}{{ end -}}
{{- toYaml $mcp -}}
{{- end }}
{{- end }}

{{- define "sg.config" -}}
{{- $models := list -}}
{{- range .Values.gateway.models }}{{ $models = append $models . }}{{ end -}}
{{- if .Values.vllm.enabled }}
{{- range .Values.vllm.models }}
{{- $replica := dict "url" (printf "http://%s:%d" (include "sg.vllmName" (dict "root" $ "model" .)) (int $.Values.vllm.port)) "destination" (printf "vllm-%s" .name) -}}
{{- if $.Values.vllm.apiKeySecret }}{{ $_ := set $replica "api_key_file" "/etc/sovereign-gateway/vllm-key/api-key" }}{{ end -}}
{{- $m := dict "name" .name "served_model_name" .servedModelName "aliases" (default (list) .aliases) "replicas" (list $replica) -}}
{{- $models = append $models $m -}}
{{- end }}
{{- end -}}
{{- $audit := dict "signing_key_file" "/etc/sovereign-gateway/audit-key/ed25519.pem" -}}
{{- if eq .Values.audit.store.type "postgresql" }}
{{- $_ := set $audit "store_file" "/etc/sovereign-gateway/audit-db/url" -}}
{{- else }}
{{- $_ := set $audit "store" "sqlite:///var/lib/sovereign-gateway/audit/audit.db" -}}
{{- end }}
{{- if .Values.audit.checkpoints.enabled }}{{ $_ := set $audit "checkpoint_dir" "/var/lib/sovereign-gateway/checkpoints" }}{{ end -}}
{{- $_ := set $audit "pseudonym_key_file" "/etc/sovereign-gateway/pseudonym-key/pseudonym.key" -}}
{{- $cfg := dict
  "listen" (dict "host" "0.0.0.0" "port" (int .Values.gateway.port))
  "telemetry" (include "sg.telemetryConfig" . | fromYaml)
  "models" $models
  "limits" .Values.gateway.limits
  "timeouts" .Values.gateway.timeouts
  "drain" .Values.gateway.drain
  "logging" (dict "level" .Values.gateway.logLevel "format" "json")
  "policy" (dict "file" (printf "%s/policy.yaml" (include "sg.configDir" .)) "guard" .Values.policy.guard)
  "audit" $audit -}}
{{- if eq .Values.gateway.reload.mode "live" }}{{ $_ := set $cfg "reload" (dict "watch" true "interval_s" .Values.gateway.reload.interval_s) }}{{ end -}}
{{- if .Values.keys.existingSecret }}{{ $_ := set $cfg "keys_file" "/etc/sovereign-gateway/keys/keys.yaml" }}{{ end -}}
{{- with (include "sg.identityConfig" . | fromYaml) }}{{ $_ := set $cfg "identity" . }}{{ end -}}
{{- with (include "sg.mcpConfig" . | fromYaml) }}{{ $_ := set $cfg "mcp" . }}{{ end -}}
{{- with .Values.preflight }}{{ if .enabled }}
{{- $pf := dict "interval_s" .intervalSeconds "regions" (include "sg.regions" $ | fromYamlArray) "jurisdictions" .jurisdictions "retention_days" .retentionDays -}}
{{- if $.Values.audit.publicKey }}{{ $_ := set $pf "audit_public_key" "/etc/sovereign-gateway/audit-key.pub" }}{{ end -}}
{{- if .signingKey.existingSecret }}
{{- $_ := set $pf "sign_key_file" (printf "/etc/sovereign-gateway/operator-key/%s" .signingKey.secretKey) -}}
{{- $_ := set $pf "evidence_dir" "/var/lib/sovereign-gateway/evidence" -}}
{{- end }}
{{- $_ := set $cfg "preflight" $pf -}}
{{- end }}{{ end -}}
{{- toYaml (mergeOverwrite $cfg (deepCopy .Values.gateway.extraConfig)) -}}
{{- end }}

{{/* The gateway container's switches that keep libraries from phoning home (the same as the
Makefile and the Containerfile; README "Hidden egress"): `gateway preflight`'s k8s.telemetry-env
check reads them from the pod spec, not from the image. A name also given in gateway.extraEnv is
left to that entry (one entry per name; the pre-flight then judges the operator's value). */}}
{{- define "sg.telemetryEnv" -}}
{{- $given := dict -}}
{{- range .Values.gateway.extraEnv }}{{ $_ := set $given .name true }}{{ end -}}
{{- $switches := list
      (list "HF_HUB_OFFLINE" "1")
      (list "HF_HUB_DISABLE_TELEMETRY" "1")
      (list "DO_NOT_TRACK" "1")
      (list "VLLM_NO_USAGE_STATS" "1")
      (list "LITELLM_LOCAL_MODEL_COST_MAP" "True") -}}
{{- range $switches }}
{{- if not (hasKey $given (index . 0)) }}
- name: {{ index . 0 }}
  value: {{ index . 1 | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Hardened container security context for the vLLM and test containers. */}}
{{- define "sg.hardenedContainer" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Hardened pod security context. */}}
{{- define "sg.hardenedPod" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* NetworkPolicy egress rule: cluster DNS only. */}}
{{- define "sg.dnsEgressRule" -}}
# cluster DNS
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.egress.dns.namespace }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.egress.dns.podLabels | nindent 10 }}
  ports:
    - port: {{ .Values.egress.dns.port }}
      protocol: UDP
    - port: {{ .Values.egress.dns.port }}
      protocol: TCP
{{- end }}

{{/* Worker processes of the gateway container (`gateway serve --workers`): gateway.workers, or
"auto" = resources.limits.cpu rounded down (at least 1); 1 when extraConfig.quotas keeps quota
state in memory (each worker would admit the whole limit), and a number > 1 is then refused. */}}
{{- define "sg.workers" -}}
{{- $q := dict -}}
{{- if hasKey .Values.gateway.extraConfig "quotas" -}}{{- $q = .Values.gateway.extraConfig.quotas | default dict -}}{{- end -}}
{{- $memoryQuotas := and (hasKey .Values.gateway.extraConfig "quotas") (ne (toString (dig "enabled" true $q)) "false") (eq (toString (dig "backend" "memory" $q)) "memory") -}}
{{- $w := .Values.gateway.workers -}}
{{- if eq (toString $w) "auto" -}}
  {{- $cpu := "" -}}
  {{- with .Values.resources -}}{{- with .limits -}}{{- $cpu = toString (.cpu | default "") -}}{{- end -}}{{- end -}}
  {{- $n := 1 -}}
  {{- if hasSuffix "m" $cpu -}}
    {{- $n = div (atoi (trimSuffix "m" $cpu)) 1000 -}}
  {{- else if $cpu -}}
    {{- $n = int (floor (float64 $cpu)) -}}
  {{- end -}}
  {{- if $memoryQuotas -}}{{- $n = 1 -}}{{- end -}}
  {{- max $n 1 -}}
{{- else -}}
  {{- if and $memoryQuotas (gt (int $w) 1) -}}
    {{- fail (printf "gateway.workers=%v with extraConfig.quotas.backend memory: each worker would keep its own quota state and admit the whole limit. Set quotas.backend: redis, or gateway.workers: 1 (or auto)." $w) -}}
  {{- end -}}
  {{- int $w -}}
{{- end -}}
{{- end }}

{{/* The gateway config's identity section (empty without issuers and trust bundle): each
issuer's jwksKey becomes its jwks_file in the mounted jwksSecret. */}}
{{- define "sg.identityConfig" -}}
{{- $id := .Values.identity -}}
{{- if or $id.issuers $id.mtls.trustBundleSecret -}}
{{- $issuers := list -}}
{{- range $id.issuers -}}
{{- $i := omit . "jwksKey" -}}
{{- $_ := set $i "jwks_file" (printf "/etc/sovereign-gateway/jwks/%s" (default "jwks.json" .jwksKey)) -}}
{{- $issuers = append $issuers $i -}}
{{- end -}}
{{- $section := dict "accept" $id.accept "issuers" $issuers "rules" $id.rules "required" $id.required -}}
{{- if $id.mtls.trustBundleSecret }}{{ $_ := set $section "mtls" (dict "trust_bundle_file" "/etc/sovereign-gateway/mtls/ca.pem") }}{{ end -}}
{{- toYaml $section -}}
{{- end -}}
{{- end }}
