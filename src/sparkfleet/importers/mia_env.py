"""Import a MiaAI ``start-tp4.sh`` / ``start.sh`` profile (``.env.tp4``) as a sparkfleet recipe.

The launcher sources the profile, then its in-container ``boot.py`` turns the keys into one
``python -m sglang.launch_server`` line (fixed flags + the keys' flags + ``EXTRA_SGLANG_ARGS``)
and ``start.sh`` passes the container keys, the ``NCCL_*`` keys and ``EXTRA_CONTAINER_ENV`` to
every rank (reference: spark-repos.md §1.1). The recipe written here launches that same line:
the flags become ``args``, the container keys ``[env]``, the Engram shard directory a
``[[staging]] kind = "sparse-rows"`` entry. Per-node facts (addresses, NIC names, SSH user)
belong to the cluster inventory, so they go to a cluster file instead. Every key is accounted
for: mapped, listed as not carried (with the reason), or listed as not understood.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from sparkfleet.config import names
from sparkfleet.config.secrets import is_secret
from sparkfleet.importers.report import ImportResult, Note, comment_block, placeholder
from sparkfleet.importers.shell_profile import OptionalBlock, Profile
from sparkfleet.importers.toml_text import TomlDoc
from sparkfleet.plan.flags import flag_groups, flag_name
from sparkfleet.plan.model import CONTAINER_HF_HOME

DEFAULT_REPO = "deepseek-ai/DeepSeek-V4.1-Flash"
DEFAULT_SERVED_NAME = "deepseek-v4.1-flash"
ENTRYPOINT = ("python3", "-m", "sglang.launch_server")

# boot.py serve(): flags it always passes, in its order (the model, --tp, --host and --port
# are sparkfleet's per-rank flags and are appended at plan time).
FIXED_HEAD: tuple[tuple[str, ...], ...] = (("--trust-remote-code",), ("--load-format", "safetensors"))
FIXED_BACKENDS: tuple[tuple[str, ...], ...] = (
    ("--attention-backend", "dsv4"),
    ("--moe-runner-backend", "flashinfer_mxfp4"),
)
FIXED_TAIL: tuple[tuple[str, ...], ...] = (
    ("--random-seed", "0"),
    ("--enable-decoder-swa-bounded-replay",),
    ("--enable-cache-report",),
    ("--tool-call-parser", "deepseekv41"),
    ("--reasoning-parser", "deepseek-v41"),
)
# Profile key -> flag, in boot.py's order.
SIZING_FLAGS = (
    ("MEM_FRACTION_STATIC", "--mem-fraction-static"),
    ("CHUNKED_PREFILL_SIZE", "--chunked-prefill-size"),
    ("CONTEXT_LENGTH", "--context-length"),
    ("MAX_RUNNING_REQUESTS", "--max-running-requests"),
)
# Flags sparkfleet appends per rank; EXTRA_SGLANG_ARGS may not set them.
PER_RANK = {"--model-path", "--model", "--tp", "--tp-size", "--nnodes", "--node-rank", "--dist-init-addr",
            "--host", "--port", "--api-key"}  # fmt: skip

# Container env start.sh always sets (docker_common_args / start-tp4.sh), before profile keys.
LAUNCHER_ENV = {
    "STATE_PATH": "/state",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_CROSS_NIC": "1",
    "NCCL_IB_MERGE_NICS": "0",
    "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
}
ENV_PREFIXES = ("DSV41_", "SGLANG_", "SPARK_", "B12X_", "NCCL_")
ENV_KEYS = {"OFFLOAD_MODE", "PYTORCH_CUDA_ALLOC_CONF", "DSPARK_SPS_TABLE", "DSPARK_STS_TABLE"}

# Keys that configure where things are; they go to the cluster file.
CLUSTER_KEYS = {
    "HEAD_IP": "head fabric address (nodes[0].fabric_ip)",
    "WORKER_IPS": "worker fabric addresses (nodes[].fabric_ip)",
    "WORKER_HOSTS": "worker SSH names (nodes[].host)",
    "WORKER_USER": "SSH user ([defaults].user)",
    "SSH_IDENTITY": "SSH key ([defaults].ssh_key)",
    "NCCL_SOCKET_IFNAME": "per-node NIC ([defaults].fabric_ifname → NCCL_/GLOO_SOCKET_IFNAME)",
    "GLOO_SOCKET_IFNAME": "per-node NIC ([defaults].fabric_ifname, or nodes[].env when it differs)",
    "IB_HCA": "RDMA devices ([defaults].ib_hca → NCCL_IB_HCA)",
    "NCCL_IB_GID_INDEX": "RoCE GID index ([defaults].ib_gid_index; start.sh detects it per node)",
}

# Keys understood but with no sparkfleet equivalent, and why.
NOT_CARRIED = {
    "MODEL_DIR": "weights are read from each node's Hugging Face cache (cluster hf_cache), "
    "or set model to an absolute path",
    "COMMON_MODEL": "launcher symlink for the checkpoint; not needed",
    "BASE_IMAGE": "base of the launcher's Dockerfile; build the image, then set docker_image",
    "BUILD_DOCKERFILE": "sparkfleet builds docker_image_dir/Dockerfile; build this one as docker_image",
    "BUILD_ARGS": "docker build arguments of the launcher's build step",
    "NFS_SHARE": 'NFS weight sharing: use a [[staging]] kind = "nfs" entry if wanted',
    "NFS_VOLUME": "NFS weight sharing (see NFS_SHARE)",
    "NFS_EXPORT_NAME": "NFS weight sharing (see NFS_SHARE)",
    "NFS_SERVER_IPS": "NFS weight sharing (see NFS_SHARE)",
    "NFS_CLIENTS": "NFS weight sharing (see NFS_SHARE)",
    "SKIP_PREPARE": "boot.py checkpoint verification; sparkfleet bypasses boot.py",
    "SKIP_VERIFY": "boot.py checkpoint verification; sparkfleet bypasses boot.py",
    "SKIP_SMOKE": "sparkfleet always runs its [verify] smoke completion",
    "SMOKE_QUICK": "boot.py smoke variant; sparkfleet runs its own [verify] smoke",
    "NCCL_HOST_DIR": "host NCCL overlay: add an [[extra_mounts]] and LD_LIBRARY_PATH in [env] if used",
    "NCCL_WORKER_DIR": "host NCCL overlay (see NCCL_HOST_DIR)",
    "NCCL_PIP_SO": "host NCCL overlay (see NCCL_HOST_DIR)",
    "NCCL_SWITCHLESS_RING_ONLY": "launcher switch for the ring NCCL overlay (see NCCL_HOST_DIR)",
    "FABRIC_IFACE": "launcher's fabric NIC for NFS routing; the cluster's fabric_ifname covers NCCL",
    "WORKER_DIR": "launcher checkout on workers; its state/ became the /state mount",
    "READY_TIMEOUT": "use [verify] timeout",
    "FORCE": "launcher flag",
    "EXPECTED_SHARDS": "launcher download check",
}


@dataclass
class _Build:
    """Mutable scratch space of one import."""

    values: dict[str, str]
    used: set[str] = field(default_factory=set)
    placeholders: list[Note] = field(default_factory=list)
    not_carried: list[Note] = field(default_factory=list)
    not_understood: list[Note] = field(default_factory=list)

    def take(self, key: str, default: str | None = None) -> str | None:
        self.used.add(key)
        value = self.values.get(key)
        return value if value not in (None, "") else default


def _args(b: _Build) -> list[tuple[list[str], str | None]]:
    """The engine flags boot.py would build from the profile, each with the key it came from."""
    served = b.take("SERVED_MODEL_NAME", DEFAULT_SERVED_NAME)
    out: list[tuple[list[str], str | None]] = [(["--served-model-name", served or ""], "SERVED_MODEL_NAME")]
    out += [(list(g), "boot.py") for g in FIXED_HEAD]
    tp = b.take("TP_SIZE", "3")
    out.append((["--ep-size", b.take("EP_SIZE", tp) or ""], "EP_SIZE"))
    out += [(list(g), "boot.py") for g in FIXED_BACKENDS]
    for key, flag in SIZING_FLAGS:
        value = b.take(key)
        if value is not None:
            out.append(([flag, value], key))
    head_fraction = b.take("HEAD_MEM_FRACTION_STATIC")
    if head_fraction is not None and head_fraction == b.values.get("MEM_FRACTION_STATIC"):
        out = [(g, "MEM_FRACTION_STATIC = HEAD_MEM_FRACTION_STATIC" if g[0] == "--mem-fraction-static" else n)
               for g, n in out]  # fmt: skip
    elif head_fraction is not None:
        detail = f"{head_fraction} differs from MEM_FRACTION_STATIC; every rank gets the same flags"
        b.not_carried.append(Note("HEAD_MEM_FRACTION_STATIC", detail))
    running = b.values.get("MAX_RUNNING_REQUESTS")
    if running:
        out.append((["--cuda-graph-max-bs-decode", running], "MAX_RUNNING_REQUESTS"))
    out += [(list(g), "boot.py") for g in FIXED_TAIL]
    algo = b.take("SPEC_ALGO")
    block = b.take("DSPARK_BLOCK_SIZE")
    if algo:
        out.append((["--speculative-algorithm", algo], "SPEC_ALGO"))
        if algo.upper() == "DSPARK" and block:
            out.append((["--speculative-dspark-block-size", block], "DSPARK_BLOCK_SIZE"))
    pin = b.take("MAX_TOTAL_TOKENS")
    if pin and pin != "0":
        out.append((["--max-total-tokens", pin], "MAX_TOTAL_TOKENS"))
    extra = b.take("EXTRA_SGLANG_ARGS")
    if extra:
        # boot.py appends EXTRA_SGLANG_ARGS.split(): a later flag wins, so replace in place.
        for group in flag_groups(extra.split()):
            flag = flag_name(group[0])
            if flag in PER_RANK:
                b.not_carried.append(Note("EXTRA_SGLANG_ARGS", f"{' '.join(group)}: set by sparkfleet per rank"))
                continue
            index = next((i for i, (g, _) in enumerate(out) if g[0] == flag), None)
            if index is None:
                out.append((group, "EXTRA_SGLANG_ARGS"))
            else:
                out[index] = (group, f"{out[index][1]}, EXTRA_SGLANG_ARGS")
    return out


def _env(b: _Build, tp4: bool) -> dict[str, tuple[str, str]]:
    """Container env: key -> (value, where it came from), in the launcher's precedence."""
    env: dict[str, tuple[str, str]] = {}
    if tp4:
        env["DSV41_LAUNCHER"] = ("tp4", "start-tp4.sh")
    tp = b.values.get("TP_SIZE") or "3"
    env["TP_SIZE"] = (tp, "TP_SIZE")
    env["EP_SIZE"] = (b.values.get("EP_SIZE") or tp, "EP_SIZE")
    for key, value in LAUNCHER_ENV.items():
        env[key] = (value, "start.sh")
    for key, value in b.values.items():
        if key in CLUSTER_KEYS or key in NOT_CARRIED or key in ("EXTRA_SGLANG_ARGS", "EXTRA_CONTAINER_ENV"):
            continue
        if key in ENV_KEYS or key.startswith(ENV_PREFIXES):
            b.used.add(key)
            if is_secret(key):
                b.not_carried.append(Note(key, "a secret: pass it at launch with --env " + key))
                continue
            env[key] = (value, key)
    extra = b.take("EXTRA_CONTAINER_ENV")
    for word in (extra or "").split():
        name, sep, value = word.partition("=")
        if not sep or not name.replace("_", "a").isalnum():
            b.not_understood.append(Note("EXTRA_CONTAINER_ENV", f"{word!r} is not KEY=VALUE"))
        elif is_secret(name):
            b.not_carried.append(Note(name, "a secret in EXTRA_CONTAINER_ENV: pass it with --env " + name))
        else:
            env[name] = (value, "EXTRA_CONTAINER_ENV")
    return env


def _gateway_route(b: _Build) -> list[tuple[str, object, str]]:
    """``[serve]`` keys for the gateway from the profile's DSV41_MAX_NEW_TOKENS, DSV41_LOOP_* and
    SGLANG_DSV41_REASONING_EFFORT (they stay in the env too: the engine's patch reads them)."""
    v = b.values

    def number(key: str) -> int | None:
        text = v.get(key)
        if text is None:
            return None
        if text.strip().isdigit():
            return int(text)
        b.not_understood.append(Note(key, f"{text!r} is not a whole number (not carried to [serve])"))
        return None

    out: list[tuple[str, object, str]] = []
    cap = number("DSV41_MAX_NEW_TOKENS")
    if cap is not None:
        out.append(("max_new_tokens", cap, "DSV41_MAX_NEW_TOKENS"))
    if v.get("DSV41_LOOP_ABORT") is not None:
        if v["DSV41_LOOP_ABORT"].strip() == "0":
            out.append(("loop_abort", False, "DSV41_LOOP_ABORT=0"))
        else:
            rules = {"ngram": number("DSV41_LOOP_NGRAM"), "repeats": number("DSV41_LOOP_REPEATS"),
                     "line_repeats": number("DSV41_LOOP_LINE_REPEATS")}  # fmt: skip
            out.append(("loop_abort", {k: n for k, n in rules.items() if n is not None}, "DSV41_LOOP_*"))
    effort = v.get("SGLANG_DSV41_REASONING_EFFORT")
    if effort is not None and effort.strip():
        value: object = int(effort) if effort.strip().isdigit() else effort.strip()
        out.append(("request_defaults", {"chat_template_kwargs": {"reasoning_effort": value}},
                    "SGLANG_DSV41_REASONING_EFFORT"))  # fmt: skip
    return out


def _snapshot(repo: str, revision: str | None, root: str) -> str:
    rev = revision or placeholder("HF_REVISION (snapshot commit of " + repo + ")")
    return f"{root}/hub/models--{repo.replace('/', '--')}/snapshots/{rev}"


def _cluster_toml(b: _Build, profile: Profile) -> str:
    """A cluster inventory from the profile's topology and fabric keys."""
    v = b.values
    workers = (v.get("WORKER_HOSTS") or "").replace(",", " ").split()
    ips = (v.get("WORKER_IPS") or "").replace(",", " ").split()
    doc = TomlDoc()
    doc.comment(f"Cluster inventory imported from {profile.source} by `sparkfleet import mia-env`.")
    doc.comment("Node order is rank order; rank 0 (the head) is where start-tp4.sh ran.")
    doc.set("name", "imported")
    doc.blank()
    doc.table("defaults")
    if v.get("WORKER_USER"):
        doc.set("user", v["WORKER_USER"], "WORKER_USER")
    if v.get("SSH_IDENTITY"):
        doc.set("ssh_key", v["SSH_IDENTITY"].replace("{{home}}", "~"), "SSH_IDENTITY")
    nic = v.get("NCCL_SOCKET_IFNAME") or v.get("GLOO_SOCKET_IFNAME")
    if nic:
        doc.set("fabric_ifname", nic, "NCCL_SOCKET_IFNAME")
    if v.get("IB_HCA"):
        doc.set("ib_hca", v["IB_HCA"], "IB_HCA")
    if v.get("NCCL_IB_GID_INDEX", "").isdigit():
        doc.set("ib_gid_index", int(v["NCCL_IB_GID_INDEX"]), "NCCL_IB_GID_INDEX")
    gloo = v.get("GLOO_SOCKET_IFNAME")
    node_env = {"GLOO_SOCKET_IFNAME": gloo} if gloo and gloo != nic else {}
    hosts = [("head", "localhost", v.get("HEAD_IP") or placeholder("HEAD_IP (head fabric address)"), True)]
    for i, host in enumerate(workers):
        try:
            names.host(host)
        except ValueError as exc:  # ssh would read it as an option, or it is two words
            b.not_understood.append(Note("WORKER_HOSTS", f"{exc}: left as a placeholder"))
            hosts.append((f"worker{i + 1}", placeholder(f"host name of worker {i + 1}"),
                          placeholder(f"fabric address of worker {i + 1}"), False))  # fmt: skip
            continue
        fabric = ips[i] if i < len(ips) else placeholder(f"fabric address of {host}")
        hosts.append((host, host, fabric, False))
    if len(ips) != len(workers):
        b.not_understood.append(Note("WORKER_IPS", f"{len(ips)} address(es) for {len(workers)} WORKER_HOSTS"))
    if "NCCL_IB_GID_INDEX" not in v:
        doc.comment("ib_gid_index = 3  # start.sh detects the RoCE v2 GID index per node (fallback 3)")
    for name, host, fabric, local in hosts:
        doc.blank()
        doc.array_table("nodes")
        doc.set("name", name)
        doc.set("host", host, "you run sparkfleet on the head, as start-tp4.sh did" if local else "WORKER_HOSTS")
        doc.set("fabric_ip", fabric, "HEAD_IP" if local else "WORKER_IPS")
        if local:
            doc.set("transport", "local")
        if node_env:
            doc.table("nodes.env")
            for key, value in node_env.items():
                doc.set(key, value)
    return doc.text()


@dataclass
class _Line:
    """What the launcher runs for one set of profile values: the engine flags, the container env
    and the fields sparkfleet's recipe holds them in."""

    args: list[tuple[list[str], str | None]]
    env: dict[str, tuple[str, str]]
    image: str | None
    port: int
    rendezvous_port: int
    required_nodes: int
    tp: int


def _line(b: _Build, tp4: bool) -> _Line:
    v = b.values
    args = _args(b)
    env = _env(b, tp4)
    repo = b.take("HF_REPO", DEFAULT_REPO) or DEFAULT_REPO
    revision = b.take("HF_REVISION")
    image = b.take("IMAGE")
    port = b.take("PORT", "8888")
    dist_port = b.take("DIST_PORT", "20000")
    workers = (v.get("WORKER_HOSTS") or "").replace(",", " ").split()
    nnodes = b.take("NNODES", str(len(workers) + 1))
    if nnodes and nnodes.isdigit() and workers and int(nnodes) != len(workers) + 1:
        b.not_understood.append(Note("NNODES", f"{nnodes} but WORKER_HOSTS names {len(workers)} worker(s)"))
    if "DSV41_SOURCE" not in env:
        env["DSV41_SOURCE"] = (
            _snapshot(repo, revision, CONTAINER_HF_HOME),
            "the checkpoint (start.sh MODEL_PATH)",
        )
        if not revision:
            b.placeholders.append(Note("DSV41_SOURCE", "snapshot commit of the checkpoint in the HF cache"))
    return _Line(args, env, image, int(port or 8888), int(dist_port or 20000), int(nnodes or 1),
                 int(v.get("TP_SIZE") or 3))  # fmt: skip


def _account(b: _Build, keys: Iterable[str]) -> None:
    """Every key of ``keys`` the line did not use: not carried (with the reason) or not understood."""
    for key in keys:
        if key in CLUSTER_KEYS:
            b.used.add(key)
        elif key in NOT_CARRIED and key not in b.used:
            b.used.add(key)
            b.not_carried.append(Note(key, NOT_CARRIED[key]))
    for key in keys:
        if key not in b.used:
            detail = f"= {b.values[key]!r} (not used by the launcher as far as sparkfleet knows)"
            b.not_understood.append(Note(key, detail))


# Words of a block's description that say nothing about which line it is.
_FILLER = {"the", "a", "an", "of", "on", "for", "to", "with", "and", "full", "profile", "line", "top", "optional",
           "either", "image", "from"}  # fmt: skip
# "KEY=VALUE" written in a block's description: a change of an active key the block needs
# (the production line's "(canary-roce image, EP_SIZE=1 above)").
_MENTIONED = re.compile(r"\b([A-Z][A-Z0-9_]*)=([^\s,;)]+)")


@dataclass
class _Variant:
    """One switched-off block of the profile as a ``[variants.NAME]`` overlay."""

    name: str
    extends: str
    block: OptionalBlock
    fields: list[tuple[str, str | int, str]]
    args_set: list[tuple[list[str], str | None]]
    args_remove: list[str]
    env_set: dict[str, tuple[str, str]]
    env_unset: list[str]
    mentioned: list[str]

    def write(self, doc: TomlDoc) -> None:
        lines = [a.line for a in self.block.assignments]
        doc.blank()
        doc.comment(f"Profile lines {min(lines)}-{max(lines)}, switched off there ({self.block.section}).")
        doc.table(f"variants.{self.name}")
        if self.extends != "base":
            doc.set("extends", self.extends)
        doc.set("description", self.block.section if self.block.follows is None else self.block.description)
        for key in self.mentioned:
            doc.comment(f"{key} is changed too: the block's description says {key}=…")
        for key, item, note in self.fields:
            doc.set(key, item, note)
        if self.args_remove:
            doc.set("args_remove", self.args_remove)
        if self.args_set:
            doc.words("args_set", self.args_set)
        if self.env_unset:
            doc.set("env_unset", self.env_unset)
        if self.env_set:
            doc.table(f"variants.{self.name}.env")
            for key, (item, src) in self.env_set.items():
                doc.set(key, item, src if src != key else None)


def _slug(text: str) -> str:
    words = re.split(r"[\s,]+", re.split(r"[(:]", text, maxsplit=1)[0].lower())
    kept = [w for w in words if w and w not in _FILLER and "/" not in w and "." not in w]
    return "-".join(re.sub(r"[^a-z0-9-]", "", w) for w in kept[:3]).strip("-")


def _variant_name(block: OptionalBlock, taken: set[str]) -> str:
    """The image's tag for a block that switches the image; else the words of its section title
    (a block of its own) or of its description (a line on top of another block)."""
    image = block.values().get("IMAGE", "")
    name = image.rsplit(":", 1)[1] if ":" in image else _slug(block.section if block.follows is None
                                                             else block.description)  # fmt: skip
    name = name or f"variant-{len(taken) + 1}"
    unique, n = name, 2
    while unique in taken or unique == "base":
        unique, n = f"{name}-{n}", n + 1
    taken.add(unique)
    return unique


def _overlay(name: str, extends: str, block: OptionalBlock, parent: _Line, line: _Line) -> _Variant:
    """What ``line`` changes relative to ``parent``, as a variant's keys."""
    fields: list[tuple[str, str | int, str]] = []
    for key, a, b, src in (("docker_image", parent.image, line.image, "IMAGE"),
                           ("port", parent.port, line.port, "PORT"),
                           ("rendezvous_port", parent.rendezvous_port, line.rendezvous_port, "DIST_PORT"),
                           ("required_nodes", parent.required_nodes, line.required_nodes, "NNODES"),
                           ("tensor_parallel_size", parent.tp, line.tp, "TP_SIZE")):  # fmt: skip
        if a != b and b is not None:
            fields.append((key, b, src))
    before = {g[0]: g for g, _ in parent.args}
    after = {g[0]: (g, src) for g, src in line.args}
    args_set = [(g, src) for flag, (g, src) in after.items() if before.get(flag) != g]
    args_remove = [flag for flag in before if flag not in after]
    env_set = {k: (val, src) for k, (val, src) in line.env.items() if parent.env.get(k, (None,))[0] != val}
    env_unset = [k for k in parent.env if k not in line.env]
    return _Variant(name, extends, block, fields, args_set, args_remove, env_set, env_unset, [])


def _variants(profile: Profile, base: _Line, tp4: bool, b: _Build) -> list[_Variant]:
    """The profile's switched-off blocks as variants, each on top of the active profile or of the
    block it follows; what a block holds that sparkfleet cannot carry is reported with its name."""
    taken: set[str] = set()
    names: list[str] = []
    lines: list[_Line] = []
    out: list[_Variant] = []
    for block in profile.optional:
        name = _variant_name(block, taken)
        chain = [block]
        while chain[0].follows is not None:
            chain.insert(0, profile.optional[chain[0].follows])
        values = dict(b.values)
        mentioned: list[str] = []
        for step in chain:
            values.update(step.values())
            for key, item in _MENTIONED.findall(step.description):
                if key in b.values:
                    values[key] = item
                    mentioned.append(key)
        vb = _Build(values)
        line = _line(vb, tp4)
        _account(vb, [*block.values(), *mentioned])
        for note in vb.not_carried:
            b.not_carried.append(Note(f"{note.key} (variant {name})", note.detail))
        for note in vb.not_understood:
            b.not_understood.append(Note(f"{note.key} (variant {name})", note.detail))
        for skipped in block.skipped:
            detail = f"{skipped.text[:60]!r}: {skipped.reason}"
            b.not_understood.append(Note(f"line {skipped.line} (variant {name})", detail))
        parent_name, parent = ("base", base) if block.follows is None else (names[block.follows], lines[block.follows])
        out.append(_overlay(name, parent_name, block, parent, line))
        out[-1].mentioned = mentioned
        names.append(name)
        lines.append(line)
    return out


def import_mia_env(profile: Profile, tp4: bool = True) -> ImportResult:
    """Map a parsed profile to recipe (and cluster) TOML, accounting for every key; the profile's
    switched-off blocks become ``[variants.NAME]``."""
    b = _Build(dict(profile.values()))
    v = b.values
    line = _line(b, tp4)
    args, env = line.args, line.env
    repo = b.take("HF_REPO", DEFAULT_REPO) or DEFAULT_REPO
    revision = b.take("HF_REVISION")
    image = line.image
    mounts: list[tuple[str, str, str]] = []
    worker_dir = b.take("WORKER_DIR")
    user = v.get("WORKER_USER")
    if worker_dir and user and worker_dir.startswith(f"/home/{user}/"):
        # The same checkout path on every node: the per-node home template keeps it portable.
        worker_dir = "{{home}}/" + worker_dir[len(f"/home/{user}/") :]
    if worker_dir:
        mounts.append((f"{worker_dir}/state", "/state", "WORKER_DIR/state → /state (boot.py state dir)"))
    engram_dir = b.take("ENGRAM_DIR")
    packed = v.get("DSV41_PACKED_DIR")
    staging = bool(engram_dir and packed and packed.startswith("/"))
    if staging and engram_dir and packed:
        mounts.append((engram_dir, packed, "ENGRAM_DIR → DSV41_PACKED_DIR (packed Engram shards)"))
    _account(b, list(v))
    variants = _variants(profile, line, tp4, b)
    for skipped in profile.skipped:
        b.not_understood.append(Note(f"line {skipped.line}", f"{skipped.text[:60]!r}: {skipped.reason}"))
    for name in profile.unresolved:
        b.not_understood.append(Note(f"${name}", "referenced but not set in the profile (expanded as empty)"))

    doc = TomlDoc()
    doc.comment(f"Imported from {profile.source} by `sparkfleet import mia-env`.")
    doc.comment("The flags are what boot.py builds from the profile; sparkfleet appends --model-path,")
    doc.comment("--tp, --nnodes, --node-rank, --dist-init-addr, --host and --port per rank.")
    doc.comment("Per-node addresses and NICs are in the cluster file written beside this one.")
    doc.comment("Search for '<SET ME' before launching: those values could not be derived.")
    doc.blank()
    doc.set("engine", "sglang")
    doc.set("name", f"Imported {PurePosixPath(profile.source).name} (MiaAI launcher profile)")
    if image:
        doc.set("docker_image", image, "IMAGE")
    else:
        doc.set("docker_image", placeholder("IMAGE"))
        b.placeholders.append(Note("docker_image", "IMAGE is not set in the profile"))
    doc.set("model", repo, "HF_REPO" if "HF_REPO" in v else "the launcher's default HF_REPO")
    if revision:
        doc.set("revision", revision, "HF_REVISION")
    doc.set("port", line.port, "PORT")
    doc.set("rendezvous_port", line.rendezvous_port, "DIST_PORT")
    doc.set("required_nodes", line.required_nodes, "NNODES")
    doc.set("tensor_parallel_size", line.tp, "TP_SIZE")
    doc.set("distributed_backend", "mp")
    doc.set("shm_size", "32g", "start.sh --shm-size 32g")
    doc.set("entrypoint", list(ENTRYPOINT), "boot.py runs sglang.launch_server")
    doc.blank()
    doc.words("args", [(g, src) for g, src in args])
    doc.blank()
    doc.table("env")
    for key, (value, src) in env.items():
        doc.set(key, value, src if src != key else None)
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "IB_HCA"):
        if key in v:
            name = "NCCL_IB_HCA" if key == "IB_HCA" else key
            doc.comment(f"{name} = {v[key]!r}  → per node in the cluster file ({CLUSTER_KEYS[key]})")
    for host, container, note in mounts:
        doc.blank()
        doc.comment(note)
        doc.array_table("extra_mounts")
        doc.set("host", host)
        doc.set("container", container)
    if staging and engram_dir:
        doc.blank()
        doc.comment("Per-rank Engram rows packed onto node-local disk (start.sh pack), read at DSV41_PACKED_DIR.")
        doc.array_table("staging")
        doc.set("kind", "sparse-rows")
        doc.set("id", "engram")
        doc.set("src", _snapshot(repo, revision, "{{hf}}"))
        doc.set("dst", engram_dir, "ENGRAM_DIR")
    serve = _gateway_route(b)
    if serve:
        doc.blank()
        doc.comment("The gateway's route for this deployment (docs/gateway.md): the profile's output cap, loop abort")
        doc.comment("and reasoning-effort default, applied in front of the engine as well as by it.")
        doc.table("serve")
        for name, item, src in serve:
            doc.set(name, item, src)
    for variant in variants:
        variant.write(doc)
    comment_block(doc, "Placeholders to fill in", b.placeholders)
    comment_block(doc, "Profile keys not carried over", b.not_carried)
    comment_block(doc, "Profile keys and lines NOT UNDERSTOOD (review them)", b.not_understood)
    return ImportResult(
        recipe_toml=doc.text(),
        cluster_toml=_cluster_toml(b, profile),
        placeholders=tuple(b.placeholders),
        not_carried=tuple(b.not_carried),
        not_understood=tuple(b.not_understood),
    )
