"""Regenerate leaderworkerset-v1.json and service-v1.json (see README.md).

Run: python tests/data/schemas/generate.py
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DNS1123 = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1035 = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
QTY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def obj(props, required=(), extra=False):
    d = {"type": "object", "properties": props, "additionalProperties": extra}
    if required:
        d["required"] = list(required)
    return d


strmap = {"type": "object", "additionalProperties": {"type": "string"}}
strarr = {"type": "array", "items": {"type": "string"}}
port = {"type": "integer", "minimum": 1, "maximum": 65535}
intorstr = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
defs = {
    "quantity": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": QTY_PATTERN}]},
    "objectMeta": obj(
        {
            "name": {"type": "string", "pattern": DNS1123, "maxLength": 253},
            "namespace": {"type": "string", "pattern": DNS1123, "maxLength": 63},
            "labels": strmap,
            "annotations": strmap,
        }
    ),
    "envVar": {
        **obj(
            {
                "name": {"type": "string", "minLength": 1},
                "value": {"type": "string"},
                "valueFrom": {
                    **obj(
                        {
                            "fieldRef": obj(
                                {"fieldPath": {"type": "string"}, "apiVersion": {"type": "string"}},
                                ["fieldPath"],
                            ),
                            "secretKeyRef": obj(
                                {
                                    "name": {"type": "string"},
                                    "key": {"type": "string"},
                                    "optional": {"type": "boolean"},
                                },
                                ["key"],
                            ),
                            "configMapKeyRef": obj(
                                {
                                    "name": {"type": "string"},
                                    "key": {"type": "string"},
                                    "optional": {"type": "boolean"},
                                },
                                ["key"],
                            ),
                            "resourceFieldRef": obj(
                                {
                                    "resource": {"type": "string"},
                                    "containerName": {"type": "string"},
                                    "divisor": {"$ref": "#/$defs/quantity"},
                                },
                                ["resource"],
                            ),
                        }
                    ),
                    "minProperties": 1,
                    "maxProperties": 1,
                },
            },
            ["name"],
        ),
        "not": {"required": ["value", "valueFrom"]},
    },
    "probe": obj(
        {
            "httpGet": obj(
                {
                    "path": {"type": "string"},
                    "port": intorstr,
                    "host": {"type": "string"},
                    "scheme": {"enum": ["HTTP", "HTTPS"]},
                    "httpHeaders": {
                        "type": "array",
                        "items": obj({"name": {"type": "string"}, "value": {"type": "string"}}, ["name", "value"]),
                    },
                },
                ["port"],
            ),
            "tcpSocket": obj({"port": intorstr, "host": {"type": "string"}}, ["port"]),
            "exec": obj({"command": strarr}),
            "initialDelaySeconds": {"type": "integer", "minimum": 0},
            "periodSeconds": {"type": "integer", "minimum": 1},
            "timeoutSeconds": {"type": "integer", "minimum": 1},
            "successThreshold": {"type": "integer", "minimum": 1},
            "failureThreshold": {"type": "integer", "minimum": 1},
        }
    ),
    "container": obj(
        {
            "name": {"type": "string", "pattern": DNS1123, "maxLength": 63},
            "image": {"type": "string", "minLength": 1},
            "imagePullPolicy": {"enum": ["Always", "Never", "IfNotPresent"]},
            "command": strarr,
            "args": strarr,
            "workingDir": {"type": "string"},
            "env": {"type": "array", "items": {"$ref": "#/$defs/envVar"}},
            "ports": {
                "type": "array",
                "items": obj(
                    {
                        "containerPort": port,
                        "hostPort": port,
                        "name": {
                            "type": "string",
                            "maxLength": 15,
                            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                        },
                        "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
                    },
                    ["containerPort"],
                ),
            },
            "resources": obj(
                {
                    "limits": {"type": "object", "additionalProperties": {"$ref": "#/$defs/quantity"}},
                    "requests": {"type": "object", "additionalProperties": {"$ref": "#/$defs/quantity"}},
                }
            ),
            "volumeMounts": {
                "type": "array",
                "items": obj(
                    {
                        "name": {"type": "string"},
                        "mountPath": {"type": "string", "pattern": "^/"},
                        "readOnly": {"type": "boolean"},
                        "subPath": {"type": "string"},
                    },
                    ["name", "mountPath"],
                ),
            },
            "readinessProbe": {"$ref": "#/$defs/probe"},
            "livenessProbe": {"$ref": "#/$defs/probe"},
            "startupProbe": {"$ref": "#/$defs/probe"},
            "securityContext": obj(
                {
                    "privileged": {"type": "boolean"},
                    "runAsUser": {"type": "integer"},
                    "capabilities": obj({"add": strarr, "drop": strarr}),
                }
            ),
            "stdin": {"type": "boolean"},
            "tty": {"type": "boolean"},
        },
        ["name"],
    ),
    "volume": {
        **obj(
            {
                "name": {"type": "string", "pattern": DNS1123, "maxLength": 63},
                "hostPath": obj(
                    {
                        "path": {"type": "string", "pattern": "^/"},
                        "type": {
                            "enum": [
                                "",
                                "DirectoryOrCreate",
                                "Directory",
                                "FileOrCreate",
                                "File",
                                "Socket",
                                "CharDevice",
                                "BlockDevice",
                            ]
                        },
                    },
                    ["path"],
                ),
                "emptyDir": obj({"medium": {"enum": ["", "Memory"]}, "sizeLimit": {"$ref": "#/$defs/quantity"}}),
                "persistentVolumeClaim": obj(
                    {"claimName": {"type": "string"}, "readOnly": {"type": "boolean"}}, ["claimName"]
                ),
                "secret": obj({"secretName": {"type": "string"}, "optional": {"type": "boolean"}}),
                "configMap": obj({"name": {"type": "string"}, "optional": {"type": "boolean"}}),
            },
            ["name"],
        ),
        "oneOf": [{"required": [k]} for k in ("hostPath", "emptyDir", "persistentVolumeClaim", "secret", "configMap")],
    },
    "podTemplateSpec": obj(
        {
            "metadata": {"$ref": "#/$defs/objectMeta"},
            "spec": obj(
                {
                    "containers": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/container"}},
                    "initContainers": {"type": "array", "items": {"$ref": "#/$defs/container"}},
                    "volumes": {"type": "array", "items": {"$ref": "#/$defs/volume"}},
                    "hostNetwork": {"type": "boolean"},
                    "hostIPC": {"type": "boolean"},
                    "hostPID": {"type": "boolean"},
                    "dnsPolicy": {"enum": ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"]},
                    "restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
                    "nodeSelector": strmap,
                    "serviceAccountName": {"type": "string"},
                    "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
                    "tolerations": {"type": "array", "items": {"type": "object"}},
                },
                ["containers"],
            ),
        }
    ),
}
lws = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "sparkfleet-tests/leaderworkerset-v1.json",
    "title": "LeaderWorkerSet leaderworkerset.x-k8s.io/v1 (structural subset, see README.md)",
    **obj(
        {
            "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
            "kind": {"const": "LeaderWorkerSet"},
            "metadata": {"allOf": [{"$ref": "#/$defs/objectMeta"}, {"required": ["name"]}]},
            "spec": obj(
                {
                    "replicas": {"type": "integer", "minimum": 0},
                    "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                    "networkConfig": obj(
                        {"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}}, ["subdomainPolicy"]
                    ),
                    "rolloutStrategy": {"type": "object"},
                    "leaderWorkerTemplate": obj(
                        {
                            "size": {"type": "integer", "minimum": 1},
                            "restartPolicy": {
                                "enum": [
                                    "Default",
                                    "RecreateGroupOnPodRestart",
                                    "RecreateGroupAfterStart",
                                    "None",
                                ]
                            },
                            "leaderTemplate": {"$ref": "#/$defs/podTemplateSpec"},
                            "workerTemplate": {"$ref": "#/$defs/podTemplateSpec"},
                            "subGroupPolicy": obj(
                                {
                                    "subGroupPolicyType": {"enum": ["LeaderWorker", "LeaderExcluded"]},
                                    "subGroupSize": {"type": "integer"},
                                }
                            ),
                        },
                        ["workerTemplate"],
                    ),
                },
                ["leaderWorkerTemplate"],
            ),
        },
        ["apiVersion", "kind", "metadata", "spec"],
    ),
    "$defs": defs,
}
svc = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "sparkfleet-tests/service-v1.json",
    "title": "Service v1 (structural subset, see README.md)",
    **obj(
        {
            "apiVersion": {"const": "v1"},
            "kind": {"const": "Service"},
            "metadata": {
                "allOf": [
                    {"$ref": "#/$defs/objectMeta"},
                    {"required": ["name"], "properties": {"name": {"pattern": DNS1035, "maxLength": 63}}},
                ]
            },
            "spec": obj(
                {
                    "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]},
                    "selector": strmap,
                    "clusterIP": {"type": "string"},
                    "publishNotReadyAddresses": {"type": "boolean"},
                    "ports": {
                        "type": "array",
                        "minItems": 1,
                        "items": obj(
                            {
                                "name": {"type": "string", "pattern": DNS1123, "maxLength": 63},
                                "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
                                "port": port,
                                "targetPort": {
                                    "anyOf": [
                                        port,
                                        {
                                            "type": "string",
                                            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                            "maxLength": 15,
                                        },
                                    ]
                                },
                                "nodePort": port,
                                "appProtocol": {"type": "string"},
                            },
                            ["port"],
                        ),
                    },
                }
            ),
        },
        ["apiVersion", "kind", "metadata", "spec"],
    ),
    "$defs": {"objectMeta": defs["objectMeta"]},
}
(HERE / "leaderworkerset-v1.json").write_text(json.dumps(lws, indent=1))
(HERE / "service-v1.json").write_text(json.dumps(svc, indent=1))
