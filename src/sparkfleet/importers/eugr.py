"""Import eugr/spark-vllm-docker files: a ``recipes/*.yaml`` recipe, or the ``.env`` that
``run-recipe.sh --discover`` (autodiscover.sh) writes.

A recipe there is the format sparkrun calls ``recipe_version: "1"`` (eugr's ``recipes/README.md``):
``name``, ``container``, ``command`` with ``{key}`` placeholders from ``defaults``, optional
``model``, ``cluster_only``, ``build_args``, ``mods``, ``env``. run-recipe.py renders the command
the same way sparkrun does, so the sparkrun importer carries it; without ``model`` the model is
the command's ``vllm serve`` argument. The ``.env`` names the cluster: ``CLUSTER_NODES`` (first
= head, addresses on the CX7 network), ``ETH_IF`` (the CX7 netdev NCCL/Gloo use) and ``IB_IF``
(the RDMA devices).
"""

from __future__ import annotations

import shlex

from sparkfleet.errors import RecipeError
from sparkfleet.importers.report import ImportResult, Note
from sparkfleet.importers.shell_profile import read_profile
from sparkfleet.importers.sparkrun import SparkrunFile, import_sparkrun, read_yaml_mapping
from sparkfleet.importers.toml_text import TomlDoc

# .env keys and where they go; anything else is listed as not understood.
ENV_NOT_CARRIED = {
    "COPY_HOSTS": "sparkfleet copies images and weights to the cluster's nodes itself",
    "LOCAL_IP": "the head is CLUSTER_NODES' first address",
    "CONTAINER_NAME": "sparkfleet names containers per deployment and rank",
    "MASTER_PORT": "the recipe's rendezvous_port",
}


def _model_from_command(command: str, source: str) -> str:
    try:
        words = shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:
        raise RecipeError(f"{source}: command: not a complete shell command line: {exc}") from None
    if len(words) >= 3 and words[:2] == ["vllm", "serve"] and not words[2].startswith("-"):
        return words[2]
    raise RecipeError(f"{source}: model: required (the command has no `vllm serve MODEL`)")


def import_eugr_recipe(file: SparkrunFile) -> ImportResult:
    """An eugr recipe as a sparkfleet recipe (vLLM; Ray only when the command asks for it)."""
    data = dict(file.data)
    if not isinstance(data.get("command"), str) or not data["command"].strip():
        raise RecipeError(f"{file.source}: command: required (an eugr recipe is a vllm serve template)")
    if not data.get("model"):
        data["model"] = _model_from_command(data["command"], file.source)
    data.setdefault("runtime", "vllm")
    return import_sparkrun(SparkrunFile(file.source, data), label="eugr")


def import_eugr_env(path: str) -> ImportResult:
    """The cluster inventory of an eugr ``.env`` (rank order = CLUSTER_NODES order)."""
    profile = read_profile(path)
    values = profile.values()
    nodes = [n for n in values.get("CLUSTER_NODES", "").replace(",", " ").split() if n]
    if not nodes:
        raise RecipeError(f"{path}: CLUSTER_NODES: required (comma-separated node addresses, head first)")
    not_carried = [Note(k, v) for k, v in ENV_NOT_CARRIED.items() if k in values]
    used = {"CLUSTER_NODES", "ETH_IF", "IB_IF", *ENV_NOT_CARRIED}
    not_understood = [Note(k, "not an autodiscover key sparkfleet knows") for k in values if k not in used]
    doc = TomlDoc()
    doc.comment(f"Cluster inventory imported from {path} by `sparkfleet import eugr`.")
    doc.comment("Node order is rank order: CLUSTER_NODES' first address is the head.")
    doc.set("name", "eugr")
    doc.blank()
    doc.table("defaults")
    if values.get("ETH_IF"):
        doc.set("fabric_ifname", values["ETH_IF"], "ETH_IF (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME)")
    if values.get("IB_IF"):
        doc.set("ib_hca", values["IB_IF"], "IB_IF (NCCL_IB_HCA)")
    doc.set("rdma", bool(values.get("IB_IF")))
    for i, address in enumerate(nodes):
        doc.blank()
        doc.array_table("nodes")
        doc.set("name", f"spark{i + 1}")
        doc.set("host", address, "CLUSTER_NODES")
        doc.set("fabric_ip", address)
    return ImportResult(recipe_toml=doc.text(), not_carried=tuple(not_carried), not_understood=tuple(not_understood))


def import_eugr(path: str) -> ImportResult:
    """A ``.env`` (by name) becomes a cluster file; anything else is read as a recipe."""
    name = path.rsplit("/", 1)[-1]
    if name == ".env" or name.endswith(".env") or name.startswith(".env"):
        return import_eugr_env(path)
    return import_eugr_recipe(read_yaml_mapping(path, "an eugr recipe"))
