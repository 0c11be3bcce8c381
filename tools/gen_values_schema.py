import json

EU_REGIONS = {
    # AWS (EU member states only; eu-west-2 London and eu-central-2 Zurich are not in the EU)
    "aws": ["eu-central-1", "eu-west-1", "eu-west-3", "eu-north-1", "eu-south-1", "eu-south-2",
            "eusc-de-east-1"],
    # Microsoft Azure
    "azure": ["westeurope", "northeurope", "francecentral", "francesouth", "germanywestcentral",
              "germanynorth", "swedencentral", "swedensouth", "italynorth", "polandcentral",
              "spaincentral"],
    # Google Cloud (europe-west2 London and europe-west6 Zurich are not in the EU)
    "gcp": ["europe-west1", "europe-west3", "europe-west4", "europe-west8", "europe-west9",
            "europe-west10", "europe-west12", "europe-north1", "europe-north2",
            "europe-central2", "europe-southwest1"],
    # Oracle Cloud Infrastructure, including the EU Sovereign Cloud regions
    "oci": ["eu-frankfurt-1", "eu-amsterdam-1", "eu-paris-1", "eu-marseille-1", "eu-milan-1",
            "eu-stockholm-1", "eu-madrid-1", "eu-frankfurt-2", "eu-madrid-2"],
    # EU sovereign providers
    "stackit": ["eu01", "eu02"],
    "scaleway": ["fr-par", "nl-ams", "pl-waw"],
    "ovhcloud": ["eu-west-gra", "eu-west-sbg", "eu-west-rbx", "eu-west-par", "eu-central-waw",
                 "eu-west-lim", "GRA", "GRA7", "GRA9", "GRA11", "SBG5", "DE1", "WAW1"],
    "hetzner": ["fsn1", "nbg1", "hel1"],
    "ionos": ["de-fra", "de-txl", "es-vit", "fr-par-ionos"],
    "open-telekom-cloud": ["eu-de", "eu-nl"],
    "exoscale": ["de-fra-1", "de-muc-1", "at-vie-1", "at-vie-2", "bg-sof-1"],
    "upcloud": ["de-fra1", "fi-hel1", "fi-hel2", "nl-ams1", "es-mad1", "pl-waw1", "se-sto1"],
}
EU_REGIONS["ovhcloud"] = ["GRA7", "GRA9", "GRA11", "SBG5", "RBX-A", "DE1", "WAW1", "EU-WEST-PAR"]
EU_REGIONS["ionos"] = ["de-fra", "de-txl", "es-vit"]

S = "string"
def obj(props, required=(), extra=False, **kw):
    d = {"type": "object", "properties": props, "additionalProperties": extra}
    if required:
        d["required"] = list(required)
    d.update(kw)
    return d

def arr(items, **kw):
    return {"type": "array", "items": items, **kw}

secret_name = {"type": S, "pattern": "^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$", "maxLength": 253}
port = {"type": "integer", "minimum": 1, "maximum": 65535}
quantity = {"type": ["string", "integer", "number"]}
k8s_obj = {"type": "object"}

eu_enum = []
for p, rs in EU_REGIONS.items():
    for r in rs:
        if r not in eu_enum:
            eu_enum.append(r)

defs = {
    "euRegion": {
        "description": "EU regions of the major clouds and of EU sovereign providers (the one list; "
                       "documented in the chart README). Extend it with sovereignty.additionalRegions.",
        "$comment": "Providers: " + "; ".join(f"{p}: {', '.join(rs)}" for p, rs in EU_REGIONS.items()),
        "type": S,
        "enum": eu_enum,
    },
    "regionName": {"type": S, "pattern": "^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", "maxLength": 63},
    "cidr": {
        "description": "IPv4 or IPv6 network in CIDR notation with a prefix length of 1 or more: "
                       "0.0.0.0/0 and ::/0 (any address) are refused.",
        "type": S,
        "if": {"pattern": "/0*$"},
        "then": {"const": "NOT 0.0.0.0/0 OR ::/0: an egress rule may never allow any address"},
        "else": {"pattern": "^([0-9]{1,3}(\\.[0-9]{1,3}){3}|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*)/([1-9]|[1-9][0-9]|1[01][0-9]|12[0-8])$"},
    },
    "image": obj({
        "repository": {"type": S, "minLength": 1},
        "tag": {"type": S},
        "digest": {"type": S, "pattern": "^(sha256:[a-f0-9]{64})?$"},
        "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    }, required=["repository"]),
    "resources": obj({
        "requests": {"type": "object", "required": ["cpu", "memory"]},
        "limits": {"type": "object", "required": ["cpu", "memory"]},
        "claims": {"type": "array"},
    }, required=["requests", "limits"]),
    "peers": arr(k8s_obj),
}

destination = obj({
    "id": {"type": S, "minLength": 1},
    "cidrs": arr({"$ref": "#/$defs/cidr"}),
    "ports": arr(obj({"port": port, "protocol": {"enum": ["TCP", "UDP", "SCTP"]}}, required=["port"]), minItems=1),
    "fqdn": {"type": ["string", "null"]},
}, required=["id", "ports"])

vllm_model = obj({
    "name": {"type": S, "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 40},
    "servedModelName": {"type": S, "minLength": 1},
    "aliases": arr({"type": S}),
    "revision": {"description": "Pinned Hugging Face commit (40 hex); branches move.",
                 "type": S, "pattern": "^[0-9a-f]{40}$"},
    "kind": {"enum": ["Deployment", "StatefulSet"]},
    "replicas": {"type": "integer", "minimum": 0},
    "tensorParallelSize": {"type": "integer", "minimum": 1, "maximum": 64},
    "gpuResource": {"type": S},
    "storeClaim": {"type": S, "minLength": 1},
    "storeSubPath": {"type": S},
    "maxModelLen": {"type": "integer", "minimum": 1},
    "extraArgs": arr({"type": S}),
    "resources": {"$ref": "#/$defs/resources"},
    "nodeSelector": {"type": "object"},
    "tolerations": arr(k8s_obj),
}, required=["name", "servedModelName", "revision", "storeClaim"])

schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "sovereign-gateway chart values",
    "$defs": defs,
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "global": {"type": "object"},
        "nameOverride": {"type": S},
        "fullnameOverride": {"type": S},
        "image": {"$ref": "#/$defs/image"},
        "imagePullSecrets": arr(k8s_obj),
        "replicaCount": {"type": "integer", "minimum": 0},
        "sovereignty": obj({
            "euOnly": {"type": "boolean"},
            "allowedRegions": arr({"$ref": "#/$defs/regionName"}, minItems=1, uniqueItems=True),
            "additionalRegions": arr(obj({
                "name": {"$ref": "#/$defs/regionName"},
                "reason": {"type": S, "minLength": 10},
            }, required=["name", "reason"])),
            "regionLabel": {"type": S, "minLength": 1},
            "zoneLabel": {"type": S, "minLength": 1},
        }, required=["euOnly", "allowedRegions", "regionLabel"],
            **{"if": {"properties": {"euOnly": {"const": True}}},
               "then": {"properties": {"allowedRegions": {"items": {"$ref": "#/$defs/euRegion"}}}}}),
        "gateway": obj({
            "port": port, "adminPort": port,
            "existingConfigMap": secret_name,
            "models": arr(k8s_obj),
            "limits": {"type": "object"},
            "timeouts": {"type": "object"},
            "extraConfig": {"type": "object"},
            "logLevel": {"enum": ["debug", "info", "warning", "error"]},
            "extraEnv": arr(obj({"name": {"type": S}, "value": {"type": S}}, required=["name", "value"])),
        }),
        "policy": obj({"document": {"type": S}, "guard": {"enum": ["enforce", "monitor"]}}),
        "keys": obj({"existingSecret": secret_name, "secretKey": {"type": S, "minLength": 1}}),
        "backendCredentials": obj({"existingSecret": secret_name}),
        "audit": obj({
            "signingKey": obj({
                "existingSecret": {**secret_name, "minLength": 1,
                                   "description": "Secret with the Ed25519 audit signing key: required."},
                "secretKey": {"type": S, "minLength": 1},
            }, required=["existingSecret"]),
            "pseudonymKey": obj({"existingSecret": secret_name, "secretKey": {"type": S, "minLength": 1}}),
            "store": obj({
                "type": {"enum": ["sqlite", "postgresql"]},
                "sqlite": obj({"size": quantity, "storageClass": {"type": S}, "existingClaim": secret_name}),
                "postgresql": obj({
                    "existingSecret": secret_name,
                    "secretKey": {"type": S, "minLength": 1},
                    "cidrs": arr({"$ref": "#/$defs/cidr"}),
                    "port": port,
                }),
            }, required=["type"],
                **{"if": {"properties": {"type": {"const": "postgresql"}}},
                   "then": {"properties": {"postgresql": {"properties": {"existingSecret": {"minLength": 1}}, "required": ["existingSecret"]}}}}),
            "checkpoints": obj({
                "enabled": {"type": "boolean"}, "size": quantity, "storageClass": {"type": S},
                "accessModes": arr({"enum": ["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]}, minItems=1),
                "existingClaim": secret_name,
            }),
        }, required=["signingKey", "store"]),
        "telemetry": obj({
            "enabled": {"type": "boolean"}, "endpoint": {"type": S},
            "cidrs": arr({"$ref": "#/$defs/cidr"}), "port": port,
        }),
        "egress": obj({
            "destinations": arr(destination),
            "dns": obj({
                "namespace": {"type": S, "minLength": 1},
                "podLabels": {"type": "object", "minProperties": 1},
                "port": port,
                "ciliumMatchPatterns": arr({"type": S}, minItems=1),
            }),
        }),
        "networkPolicy": obj({
            "enabled": {"type": "boolean"},
            "flavor": {"enum": ["kubernetes", "cilium"]},
            "ingressFrom": {"$ref": "#/$defs/peers"},
            "metricsFrom": {"$ref": "#/$defs/peers"},
        }),
        "service": obj({
            "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
            "port": port, "annotations": {"type": "object"},
        }),
        "serviceAccount": obj({"create": {"type": "boolean"}, "name": {"type": S}}),
        "podAnnotations": {"type": "object"},
        "podLabels": {"type": "object"},
        "podSecurityContext": {
            "type": "object",
            "required": ["runAsNonRoot", "runAsUser", "seccompProfile"],
            "properties": {
                "runAsNonRoot": {"const": True},
                "runAsUser": {"type": "integer", "minimum": 10000},
                "runAsGroup": {"type": "integer", "minimum": 10000},
                "seccompProfile": obj({"type": {"enum": ["RuntimeDefault", "Localhost"]},
                                       "localhostProfile": {"type": S}}, required=["type"]),
            },
        },
        "securityContext": {
            "type": "object",
            "required": ["runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation", "capabilities"],
            "properties": {
                "runAsNonRoot": {"const": True},
                "runAsUser": {"type": "integer", "minimum": 10000},
                "runAsGroup": {"type": "integer", "minimum": 10000},
                "readOnlyRootFilesystem": {"const": True},
                "allowPrivilegeEscalation": {"const": False},
                "privileged": {"const": False},
                "capabilities": {"type": "object", "required": ["drop"],
                                 "properties": {"drop": {"contains": {"const": "ALL"}},
                                                "add": {"maxItems": 0}}},
                "seccompProfile": obj({"type": {"enum": ["RuntimeDefault", "Localhost"]},
                                       "localhostProfile": {"type": S}}, required=["type"]),
            },
        },
        "resources": {"$ref": "#/$defs/resources"},
        "tmpSizeLimit": quantity,
        "probes": {"type": "object"},
        "podDisruptionBudget": obj({"enabled": {"type": "boolean"}, "minAvailable": {"type": ["integer", "string"]}}),
        "autoscaling": obj({
            "enabled": {"type": "boolean"},
            "minReplicas": {"type": "integer", "minimum": 1},
            "maxReplicas": {"type": "integer", "minimum": 1},
            "targetCPUUtilizationPercentage": {"type": "integer", "minimum": 1, "maximum": 100},
        }),
        "topologySpread": obj({
            "enabled": {"type": "boolean"}, "maxSkew": {"type": "integer", "minimum": 1},
            "whenUnsatisfiable": {"enum": ["DoNotSchedule", "ScheduleAnyway"]},
        }),
        "nodeSelector": {"type": "object"},
        "tolerations": arr(k8s_obj),
        "priorityClassName": {"type": S},
        "serviceMonitor": obj({"enabled": {"type": "boolean"}, "interval": {"type": S}, "labels": {"type": "object"}}),
        "vllm": obj({
            "enabled": {"type": "boolean"},
            "image": {"$ref": "#/$defs/image"},
            "port": port,
            "runAsUser": {"type": "integer", "minimum": 10000},
            "apiKeySecret": secret_name,
            "models": arr(vllm_model),
            "resources": {"$ref": "#/$defs/resources"},
            "shmSizeLimit": quantity,
        }),
        "helmTest": obj({"apiKeySecret": secret_name}),
    },
    "required": ["sovereignty", "audit", "egress", "networkPolicy", "securityContext", "podSecurityContext"],
    "allOf": [
        {
            "description": "Several gateway replicas (or autoscaling) need a shared audit store: PostgreSQL.",
            "if": {"anyOf": [
                {"properties": {"replicaCount": {"minimum": 2}}, "required": ["replicaCount"]},
                {"properties": {"autoscaling": {"properties": {"enabled": {"const": True}}, "required": ["enabled"]}},
                 "required": ["autoscaling"]},
            ]},
            "then": {"properties": {"audit": {"properties": {"store": {"properties": {"type": {"const": "postgresql"}}}}}}},
        },
    ],
}

with open("/work/main/helm/sovereign-gateway/values.schema.json", "w") as f:
    json.dump(schema, f, indent=2)
    f.write("\n")
print(len(eu_enum))
