{{/*
Checks that values.schema.json cannot express. Each fails the render with one clear line.
*/}}
{{- define "sg.validate" -}}
{{- if and .Values.networkPolicy.enabled (ne .Values.networkPolicy.flavor "cilium") }}
{{- range (include "sg.egressDestinations" . | fromJson).items }}
{{- if not .cidrs }}
{{- fail (printf "egress destination %q has only a hostname (%v) and no CIDR: a Kubernetes NetworkPolicy cannot allow it. Set networkPolicy.flavor=cilium (toFQDNs) or give the destination CIDRs in the policy." .id .fqdn) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq .Values.audit.store.type "postgresql") .Values.networkPolicy.enabled (not .Values.audit.store.postgresql.cidrs) }}
{{- fail "audit.store.postgresql.cidrs is empty: the egress policy needs the database address (CIDR) to allow the audit store" }}
{{- end }}
{{- if and .Values.telemetry.enabled .Values.networkPolicy.enabled (not .Values.telemetry.cidrs) }}
{{- fail "telemetry.cidrs is empty: the egress policy needs the collector address (CIDR) when telemetry.enabled=true" }}
{{- end }}
{{- if and .Values.gateway.existingConfigMap .Values.gateway.existingConfigSecret }}
{{- fail "set either gateway.existingConfigMap or gateway.existingConfigSecret, not both" }}
{{- end }}
{{- if and (not (include "sg.externalConfig" .)) (not .Values.policy.document) }}
{{- fail "policy.document is empty: the gateway enforces an egress policy file. Set it with --set-file policy.document=policy.yaml (or use gateway.existingConfigMap / existingConfigSecret)" }}
{{- end }}
{{- if and (not (include "sg.externalConfig" .)) (not .Values.gateway.models) (not (and .Values.vllm.enabled .Values.vllm.models)) }}
{{- fail "no model configured: set gateway.models (backends outside the chart) or vllm.enabled with vllm.models" }}
{{- end }}
{{- $several := or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}
{{- if and $several .Values.audit.checkpoints.enabled (not .Values.audit.checkpoints.existingClaim) (not (has "ReadWriteMany" .Values.audit.checkpoints.accessModes)) }}
{{- fail "audit.checkpoints.accessModes must include ReadWriteMany: several gateway replicas share the checkpoint volume (or set audit.checkpoints.existingClaim)" }}
{{- end }}
{{- $ids := dict }}
{{- range .Values.egress.destinations }}
{{- if hasKey $ids .id }}{{ fail (printf "egress destination id %q appears twice" .id) }}{{ end }}
{{- $_ := set $ids .id true }}
{{- end }}
{{- if and .Values.identity.required (not .Values.identity.issuers) (not .Values.identity.mtls.trustBundleSecret) }}
{{- fail "identity.required is true but identity.issuers is empty and identity.mtls.trustBundleSecret is not set: callers could not be identified" }}
{{- end }}
{{- if and .Values.identity.issuers (not .Values.identity.jwksSecret) }}
{{- fail "identity.issuers is set but identity.jwksSecret is not: the issuers' JWKS files come from that Secret" }}
{{- end }}
{{- include "sg.validatePolicyRefs" . }}
{{- end }}

{{/*
Every destination the rendered config names must be defined in policy.document, as the gateway
checks at start (`gateway check-config`): replica destinations, the in-chart vLLM destinations
and the telemetry collector's destination. And egress.destinations must name exactly the
policy's destinations (it is `policy networkpolicy --format helm-values` output for it).
*/}}
{{- define "sg.validatePolicyRefs" -}}
{{- if and (not (include "sg.externalConfig" .)) .Values.policy.document }}
{{- $doc := fromYaml .Values.policy.document }}
{{- if hasKey $doc "Error" }}{{ fail (printf "policy.document is not YAML: %v" $doc.Error) }}{{ end }}
{{- $policyIds := list }}
{{- range ($doc.destinations | default list) }}{{ if kindIs "map" . }}{{ $policyIds = append $policyIds (toString .id) }}{{ end }}{{ end }}
{{- $refs := list }}
{{- range .Values.gateway.models }}{{ $m := . }}{{ range (.replicas | default list) }}{{ with .destination }}{{ $refs = append $refs (list (printf "gateway.models[%s] replica destination" $m.name) .) }}{{ end }}{{ end }}{{ end }}
{{- if .Values.vllm.enabled }}{{ range .Values.vllm.models }}{{ $refs = append $refs (list (printf "vllm.models[%s] (in-chart backend) destination" .name) (printf "vllm-%s" .name)) }}{{ end }}{{ end }}
{{- if .Values.telemetry.enabled }}{{ $refs = append $refs (list "telemetry.destination" .Values.telemetry.destination) }}{{ end }}
{{- range .Values.mcp.servers }}{{ $refs = append $refs (list (printf "mcp.servers[%s] destination" .name) .destination) }}{{ end }}
{{- range $refs }}
{{- if not (has (index . 1) $policyIds) }}
{{- fail (printf "%s %q is not a destination of policy.document (it defines: %s): the gateway would refuse to start" (index . 0) (index . 1) (join ", " $policyIds)) }}
{{- end }}
{{- end }}
{{- include "sg.validateMcpServers" (dict "root" . "doc" $doc) }}
{{- if .Values.networkPolicy.enabled }}
{{- $egressIds := list }}
{{- range .Values.egress.destinations }}{{ $egressIds = append $egressIds .id }}{{ end }}
{{- if ne (sortAlpha $egressIds | join ",") (sortAlpha $policyIds | join ",") }}
{{- fail (printf "egress.destinations (%s) are not the destinations of policy.document (%s): render them with `policy networkpolicy policy.yaml --format helm-values` from the same file" (sortAlpha $egressIds | join ", ") (sortAlpha $policyIds | join ", ")) }}
{{- end }}
{{- if .Values.telemetry.enabled }}
{{- range .Values.egress.destinations }}
{{- if eq .id $.Values.telemetry.destination }}
{{- $dest := . }}
{{- range $.Values.telemetry.cidrs }}
{{- if not (has . $dest.cidrs) }}
{{- fail (printf "telemetry.cidrs entry %s is not a CIDR of policy destination %q (%s): the network rule would allow a collector the gateway may not export to" . $dest.id (join ", " $dest.cidrs)) }}
{{- end }}
{{- end }}
{{- $ports := list }}{{ range $dest.ports }}{{ $ports = append $ports (int .port) }}{{ end }}
{{- if not (has (int $.Values.telemetry.port) $ports) }}
{{- fail (printf "telemetry.port %d is not a port of policy destination %q" (int $.Values.telemetry.port) $dest.id) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Each mcp.servers entry must name a policy destination of purpose tool (the policy refuses data
to any other purpose), and its optional region/jurisdiction must be that destination's: the
values cannot claim a place the policy does not grant. The gateway's own mcp: section cannot
come from both the mcp: values and gateway.extraConfig.mcp.
*/}}
{{- define "sg.validateMcpServers" -}}
{{- $root := .root }}
{{- if and $root.Values.mcp.servers (hasKey $root.Values.gateway.extraConfig "mcp") }}
{{- fail "mcp.servers and gateway.extraConfig.mcp are both set: declare MCP servers in one place (the mcp: values)" }}
{{- end }}
{{- range $root.Values.mcp.servers }}
{{- $server := . }}
{{- range ($.doc.destinations | default list) }}
{{- if and (kindIs "map" .) (eq (toString .id) $server.destination) }}
{{- if ne (toString (default "inference" .purpose)) "tool" }}
{{- fail (printf "mcp.servers[%s] destination %q has purpose %q in policy.document: an MCP server's destination must have purpose tool" $server.name $server.destination (toString (default "inference" .purpose))) }}
{{- end }}
{{- if and $server.region (ne (toString $server.region) (toString .region)) }}
{{- fail (printf "mcp.servers[%s] region %q is not the region of policy destination %q (%s)" $server.name $server.region $server.destination (toString .region)) }}
{{- end }}
{{- if and $server.jurisdiction (ne (toString $server.jurisdiction) (toString .jurisdiction)) }}
{{- fail (printf "mcp.servers[%s] jurisdiction %q is not the jurisdiction of policy destination %q (%s)" $server.name $server.jurisdiction $server.destination (toString .jurisdiction)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
