"""Export a recipe as a Kubernetes LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) plus a Service.

One LWS group is one deployment: the leader pod is rank 0, worker pods are ranks 1..N-1
(``size`` = required_nodes). LWS injects ``LWS_LEADER_ADDRESS`` and ``LWS_WORKER_INDEX`` into
every pod; kubelet expands ``$(VAR)`` in command words and env values, so the engine's
rendezvous flags carry those references (engines.md §6), and a ``$(`` the recipe means literally
is written ``$$(`` (kubelet would otherwise expand ``$(HF_TOKEN)`` to the Secret's value). Pods
use the host network (RoCE and NCCL want the host's NICs), ``/dev/shm`` as a memory-backed
emptyDir, ``/dev/infiniband`` from the host, the node's Hugging Face cache read-only, and
``nvidia.com/gpu``. The leader is Ready only when rank 0's health endpoint answers; a Service
publishes it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from sparkfleet.config.cluster import Node
from sparkfleet.config.recipe import Recipe
from sparkfleet.config.secrets import is_secret
from sparkfleet.config.sizes import parse_size
from sparkfleet.errors import RecipeError
from sparkfleet.exporters.rank_templates import Markers, NodeShape, rank_templates, staged_paths
from sparkfleet.plan.engines import engine_for
from sparkfleet.plan.model import CONTAINER_HF_HOME, RankPlan
from sparkfleet.plan.secret_args import mask_words

LWS_API = "leaderworkerset.x-k8s.io/v1"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
HOST_IP_VAR = "SPARKFLEET_HOST_IP"
GIB = 1024**3

# The planner is given these stand-ins for the leader's address, a pod's own address and the worker
# index; they hold no "$", so escaping the planned words for kubelet leaves them intact, and only
# then do they become kubelet references.
_LEADER = "\x00lws-leader\x00"
_HOST_IP = "\x00host-ip\x00"
_INDEX = "\x00worker-index\x00"
_REFERENCES = {_LEADER: "$(LWS_LEADER_ADDRESS)", _HOST_IP: f"$({HOST_IP_VAR})", _INDEX: "$(LWS_WORKER_INDEX)"}
# kubelet expands $(NAME) and reduces $$ to $: a "$" before "(" or "$" needs a second one.
_KUBELET_SPECIAL = re.compile(r"\$(?=[($])")


def _references(text: str) -> str:
    for stand_in, reference in _REFERENCES.items():
        text = text.replace(stand_in, reference)
    return text


def kubelet_literal(text: str) -> str:
    """A command word or env value that kubelet hands the container exactly as planned, with the
    stand-ins turned into the LWS/downward-API references it is meant to expand."""
    return _references(_KUBELET_SPECIAL.sub("$$", text))


@dataclass(frozen=True)
class K8sOptions:
    """What the cluster, not the recipe, decides."""

    image: str | None = None
    namespace: str | None = None
    gpus_per_node: int = 1
    hf_cache: str = "/root/.cache/huggingface"
    home: str = "/root"
    rdma: bool = True
    replicas: int = 1
    # Where `sparkfleet stage` wrote on the nodes (staged and composed data): None = the
    # cluster's state_dir when one is given, else sparkfleet's default for root.
    state_dir: str | None = None


DEFAULT_STATE_DIR = "/root/.local/state/sparkfleet"


def k8s_name(name: str) -> str:
    """A DNS-1035 label (lowercase, digits, dashes; starts with a letter), short enough for pod names."""
    clean = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not clean or not clean[0].isalpha():
        clean = "sf-" + clean
    return clean[:40].rstrip("-")


def _quantity(size: str) -> str:
    n = parse_size(size)
    return f"{n // GIB}Gi" if n % GIB == 0 else str(n)


def _env(rank: RankPlan, secret_name: str, host_ip_keys: tuple[str, ...]) -> list[dict[str, Any]]:
    # The host address first: later values may refer to it as $(SPARKFLEET_HOST_IP).
    env: list[dict[str, Any]] = [{"name": HOST_IP_VAR, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    for var in rank.env:
        if var.key in host_ip_keys:
            env.append({"name": var.key, "value": f"$({HOST_IP_VAR})"})
        elif var.secret:
            # Secrets never go in the manifest: they come from a Secret the user creates.
            ref = {"name": secret_name, "key": var.key}
            env.append({"name": var.key, "valueFrom": {"secretKeyRef": ref}})
        else:
            env.append({"name": var.key, "value": kubelet_literal(var.value)})
    return env


def _volumes(rank: RankPlan, recipe: Recipe, rdma: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shm: dict[str, Any] = {"medium": "Memory"}
    if recipe.shm_size:
        shm["sizeLimit"] = _quantity(recipe.shm_size)
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": shm}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if rdma:
        volumes.append({"name": "infiniband", "hostPath": {"path": "/dev/infiniband"}})
        mounts.append({"name": "infiniband", "mountPath": "/dev/infiniband"})
    for i, m in enumerate(rank.mounts):
        name = "hf-cache" if m.container == CONTAINER_HF_HOME else f"mount-{i}"
        # Paths are not expanded by kubelet: stand-ins ({{rank}} in a mount) resolve, "$" stays.
        volumes.append({"name": name, "hostPath": {"path": _references(m.host)}})
        mounts.append({"name": name, "mountPath": _references(m.container), "readOnly": m.read_only})
    return volumes, mounts


def _container(
    role: str, rank: RankPlan, recipe: Recipe, image: str, opts: K8sOptions, secret: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    volumes, mounts = _volumes(rank, recipe, opts.rdma)
    host_ip_keys = engine_for(recipe.engine).host_ip_env
    container: dict[str, Any] = {
        "name": role,
        "image": image,
        "command": [kubelet_literal(word) for word in mask_words(rank.argv, rank.secret_words)],
        "env": _env(rank, secret, host_ip_keys),
        "securityContext": {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}},
        "volumeMounts": mounts,
    }
    if opts.gpus_per_node:
        container["resources"] = {"limits": {"nvidia.com/gpu": opts.gpus_per_node}}
    ready = rank.readiness
    if ready.serves_http and ready.health_path:
        port = rank.ports[0]
        container["ports"] = [{"containerPort": port, "name": "http", "protocol": "TCP"}]
        probe = {"httpGet": {"path": ready.health_path, "port": port}}
        container["readinessProbe"] = {**probe, "periodSeconds": 10, "failureThreshold": 3}
        # Loading a large model takes many minutes: the startup probe covers [verify] timeout.
        startup_failures = max(1, math.ceil(recipe.verify.timeout / 10))
        container["startupProbe"] = {**probe, "periodSeconds": 10, "failureThreshold": startup_failures}
    elif ready.tcp_port:
        container["readinessProbe"] = {"tcpSocket": {"port": ready.tcp_port}, "periodSeconds": 10}
    return container, volumes


def _pod(container: dict[str, Any], volumes: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels},
        "spec": {
            "hostNetwork": True,
            "hostIPC": True,
            "dnsPolicy": "ClusterFirstWithHostNet",
            "containers": [container],
            "volumes": volumes,
        },
    }


def k8s_manifests(
    recipe: Recipe, deployment: str, opts: K8sOptions | None = None, like: Node | None = None
) -> list[dict[str, Any]]:
    """The LeaderWorkerSet and leader Service of a recipe; ``like`` lends its NIC settings to every pod."""
    opts = opts or K8sOptions()
    image = opts.image or recipe.docker_image
    if not image:
        raise RecipeError(f"{recipe.source}: docker_image: required for Kubernetes (or pass --image)")
    recipe = recipe.model_copy(update={"docker_image": image})
    name = k8s_name(deployment)
    markers = Markers(
        head=_LEADER,
        self_addr=_HOST_IP,
        rank=_INDEX,
        # Rank 0 plans itself at its host IP, the value VLLM_HOST_IP/SGLANG_HOST_IP get: a Ray
        # head advertising the leader's DNS name instead never sees vLLM's placement group ready.
        leader_self=_HOST_IP,
        # Worker pods are <lws>-<group>-<index> under the LWS headless service <lws>.
        peer=lambda i: f"{name}-0-{i}.{name}",
    )
    state = opts.state_dir or (like.state_dir if like is not None else DEFAULT_STATE_DIR)
    shape = NodeShape(opts.hf_cache, opts.home, state, like)
    templates = rank_templates(recipe, name, markers, shape)
    secret = f"{name}-secrets"
    leader, leader_volumes = _container("leader", templates.leader, recipe, image, opts, secret)
    lwt: dict[str, Any] = {
        "size": recipe.required_nodes,
        "restartPolicy": "RecreateGroupOnPodRestart",
        "leaderTemplate": _pod(leader, leader_volumes, {"role": "leader"}),
    }
    worker_rank = templates.worker or templates.leader
    worker, worker_volumes = _container("worker", worker_rank, recipe, image, opts, secret)
    lwt["workerTemplate"] = _pod(worker, worker_volumes, {"role": "worker"})
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "sparkfleet"}}
    if opts.namespace:
        metadata["namespace"] = opts.namespace
    lws = {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": metadata,
        "spec": {"replicas": opts.replicas, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": lwt},
    }
    port = templates.plan.port
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {**metadata, "name": f"{name}-leader"},
        "spec": {
            "type": "ClusterIP",
            "selector": {NAME_LABEL: name, "role": "leader"},
            "ports": [{"name": "http", "protocol": "TCP", "port": port, "targetPort": port}],
        },
    }
    return [lws, service]


def k8s_yaml(recipe: Recipe, deployment: str, opts: K8sOptions | None = None, like: Node | None = None) -> str:
    """The manifests as one multi-document YAML file for ``kubectl apply -f``."""
    docs = k8s_manifests(recipe, deployment, opts, like)
    header = f"# sparkfleet export k8s of {recipe.source}\n"
    secrets = sorted({k for k in recipe.env if is_secret(k)})
    if secrets:
        header += f"# Create Secret {k8s_name(deployment)}-secrets with keys {', '.join(secrets)} first.\n"
    steps = [s.id for s in recipe.staging] + (["composed_model"] if recipe.composed_model else [])
    if steps:
        # Staging runs on each node before serving; Kubernetes only mounts what it left there.
        opts = opts or K8sOptions()
        state = opts.state_dir or (like.state_dir if like is not None else DEFAULT_STATE_DIR)
        values = {"hf": opts.hf_cache.rstrip("/"), "state": state, "home": opts.home,
                  "name": k8s_name(deployment), "node": "<node>", "rank": "<rank>"}  # fmt: skip
        header += f"# Stage on every node first (sparkfleet stage): {', '.join(steps)}; the pods mount\n"
        header += f"# {', '.join(staged_paths(recipe, k8s_name(deployment), values))} (state_dir {state}).\n"
    return header + yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False, default_flow_style=False)


class _NoAliases(yaml.SafeDumper):
    """Write repeated objects out in full: anchors/aliases confuse readers of a manifest."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
