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
{{- include "sg.validateEgressUnion" . }}
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

{{/*
The gateway's egress CIDRs together may not allow every IPv4 or every IPv6 address, whatever the
ports: the schema refuses 0.0.0.0/0 and ::/0 one CIDR at a time, and 0.0.0.0/1 + 128.0.0.0/1 (or
::/1 + 8000::/1) are the same rule written in two. Each CIDR becomes the bit string of its
prefix ("sg.cidrBits"; an IPv4-mapped IPv6 CIDR, ::ffff:0:0/96 and inside, counts as the IPv4
CIDR it is, as Kubernetes' Go parser reads it); "sg.coversAll" then asks, prefix by prefix,
whether a CIDR holds it or both of its halves are held.
*/}}
{{- define "sg.validateEgressUnion" -}}
{{- if .Values.networkPolicy.enabled }}
{{- $cidrs := list }}
{{- range (include "sg.egressDestinations" . | fromJson).items }}{{ range (.cidrs | default list) }}{{ $cidrs = append $cidrs (toString .) }}{{ end }}{{ end }}
{{- if eq .Values.audit.store.type "postgresql" }}{{ range (.Values.audit.store.postgresql.cidrs | default list) }}{{ $cidrs = append $cidrs (toString .) }}{{ end }}{{ end }}
{{- if .Values.telemetry.enabled }}{{ range (.Values.telemetry.cidrs | default list) }}{{ $cidrs = append $cidrs (toString .) }}{{ end }}{{ end }}
{{- $byVersion := dict "4" list "6" list }}
{{- $named := dict "4" list "6" list }}
{{- range $cidrs }}
{{- $b := include "sg.cidrBits" . | fromJson }}
{{- $_ := set $byVersion $b.v (append (get $byVersion $b.v) $b.bits) }}
{{- $_ := set $named $b.v (append (get $named $b.v) .) }}
{{- end }}
{{- range $v, $all := dict "4" "0.0.0.0/0" "6" "::/0" }}
{{- $set := get $byVersion $v }}
{{- if and $set (include "sg.coversAll" (dict "p" "" "set" $set "max" (ternary 32 128 (eq $v "4")))) }}
{{- fail (printf "the gateway's egress CIDRs together allow every IPv%s address, as %s would (%s, from egress.destinations, audit.store.postgresql.cidrs and telemetry.cidrs): an egress rule may never allow any address; name the networks the destinations are in" $v $all (join ", " (get $named $v | uniq))) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* {"v": "4"|"6", "bits": the first <prefix> bits of the address} of one CIDR string. */}}
{{- define "sg.cidrBits" -}}
{{- $parts := splitList "/" . }}
{{- if ne (len $parts) 2 }}{{ fail (printf "egress CIDR %q has no prefix length" .) }}{{ end }}
{{- $addr := lower (index $parts 0) }}
{{- $prefix := atoi (index $parts 1) }}
{{- $bits := "" }}
{{- $v := "4" }}
{{- if contains ":" $addr }}
{{- $v = "6" }}
{{- $halves := splitList "::" $addr }}
{{- if gt (len $halves) 2 }}{{ fail (printf "egress CIDR %q: '::' appears twice" .) }}{{ end }}
{{- $sides := list }}
{{- range $halves }}
{{- $side := "" }}
{{- if . }}{{ range splitList ":" . }}{{ $side = print $side (include "sg.groupBits" .) }}{{ end }}{{ end }}
{{- $sides = append $sides $side }}
{{- end }}
{{- $fill := 0 }}
{{- if eq (len $halves) 2 }}{{ $fill = sub 128 (add (len (index $sides 0)) (len (index $sides 1))) | int }}{{ end }}
{{- if lt $fill 0 }}{{ fail (printf "egress CIDR %q is not an IPv6 address" .) }}{{ end }}
{{- $bits = print (index $sides 0) (repeat $fill "0") (rest $sides | join "") }}
{{- if ne (len $bits) 128 }}{{ fail (printf "egress CIDR %q is not an IPv6 address" .) }}{{ end }}
{{- if and (ge $prefix 96) (hasPrefix (print (repeat 80 "0") (repeat 16 "1")) $bits) }}
{{- $v = "4" }}{{ $bits = substr 96 128 $bits }}{{ $prefix = sub $prefix 96 | int }}
{{- end }}
{{- else }}
{{- $octets := splitList "." $addr }}
{{- if ne (len $octets) 4 }}{{ fail (printf "egress CIDR %q is not an IPv4 address" .) }}{{ end }}
{{- range $octets }}{{ $bits = print $bits (printf "%08b" (atoi .)) }}{{ end }}
{{- end }}
{{- if gt $prefix (len $bits) }}{{ fail (printf "egress CIDR %q: prefix longer than the address" .) }}{{ end }}
{{- toJson (dict "v" $v "bits" (trunc $prefix $bits)) }}
{{- end }}

{{/* The 16 bits of one IPv6 group (hex, 1 to 4 digits), or the 32 of an embedded IPv4. */}}
{{- define "sg.groupBits" -}}
{{- if contains "." . }}
{{- range splitList "." . }}{{ printf "%08b" (atoi .) }}{{ end }}
{{- else }}
{{- if gt (len .) 4 }}{{ fail (printf "IPv6 group %q of an egress CIDR has more than 4 hex digits" .) }}{{ end }}
{{- $nibbles := dict "0" "0000" "1" "0001" "2" "0010" "3" "0011" "4" "0100" "5" "0101" "6" "0110" "7" "0111" "8" "1000" "9" "1001" "a" "1010" "b" "1011" "c" "1100" "d" "1101" "e" "1110" "f" "1111" }}
{{- range splitList "" (print (repeat (sub 4 (len .) | int) "0") .) }}{{ get $nibbles . }}{{ end }}
{{- end }}
{{- end }}

{{/* "yes" when the CIDR bit strings in .set together hold every address starting with .p. */}}
{{- define "sg.coversAll" -}}
{{- $p := .p }}
{{- $held := false }}
{{- $inside := false }}
{{- range .set }}{{ if hasPrefix . $p }}{{ $held = true }}{{ else if hasPrefix $p . }}{{ $inside = true }}{{ end }}{{ end }}
{{- if $held }}yes
{{- else if and $inside (lt (len $p) (int .max)) }}
{{- if and (include "sg.coversAll" (dict "p" (print $p "0") "set" .set "max" .max)) (include "sg.coversAll" (dict "p" (print $p "1") "set" .set "max" .max)) }}yes{{ end }}
{{- end }}
{{- end }}
