"""`export k8s`: LeaderWorkerSet + Service manifests that validate and wire rendezvous to LWS."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import load_recipe, parse_recipe
from sparkfleet.errors import RecipeError
from sparkfleet.exporters.k8s_lws import K8sOptions, k8s_manifests, k8s_name, k8s_yaml
from tests.conftest import ROOT, SEEDS

SCHEMAS = ROOT / "tests" / "data" / "schemas"
MIA = SEEDS / "dsv41-flash-4x-mia"
EUGR = SEEDS / "dsv41-flash-eugr-0913-4x"


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


LWS = _validator("leaderworkerset-v1.json")
SERVICE = _validator("service-v1.json")


def _docs(recipe_path: Path, name: str, **opts: Any) -> list[dict[str, Any]]:
    text = k8s_yaml(load_recipe(recipe_path), name, K8sOptions(**opts))
    return list(yaml.safe_load_all(text))


def _validate(docs: list[dict[str, Any]]) -> None:
    lws, svc = docs
    LWS.validate(lws)
    SERVICE.validate(svc)


def _container(lws: dict[str, Any], role: str) -> dict[str, Any]:
    return lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]["spec"]["containers"][0]


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("path", [MIA, EUGR], ids=["sglang-seed", "vllm-seed"])
def test_seed_exports_validate_against_lws_and_service_schemas(path: Path) -> None:
    _validate(_docs(path, path.name))


def test_sglang_rendezvous_uses_lws_leader_address_and_worker_index() -> None:
    lws, svc = _docs(MIA, "dsv41 mia")
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 4 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = _container(lws, "leader"), _container(lws, "worker")
    # The leader rendezvouses at its own host IP; workers reach that IP by the leader's name.
    roles = ((leader, "0", "$(SPARKFLEET_HOST_IP)"), (worker, "$(LWS_WORKER_INDEX)", "$(LWS_LEADER_ADDRESS)"))
    for c, rank, head in roles:
        argv = c["command"]
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert _flag(argv, "--dist-init-addr") == f"{head}:20000"
        assert _flag(argv, "--node-rank") == rank and _flag(argv, "--nnodes") == "4"
        env = {e["name"]: e for e in c["env"]}
        assert env["SGLANG_HOST_IP"]["value"] == "$(SPARKFLEET_HOST_IP)"
        assert c["env"][0] == {
            "name": "SPARKFLEET_HOST_IP",
            "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
        }
        assert env["DSV41_LAUNCHER"]["value"] == "tp4"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert {"/dev/shm", "/dev/infiniband", "/root/.cache/huggingface", "/state"} <= mounts.keys()
        assert mounts["/root/.cache/huggingface"]["readOnly"] is True
    pod = lwt["leaderTemplate"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert volumes["infiniband"]["hostPath"]["path"] == "/dev/infiniband"
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 30000}
    assert "readinessProbe" not in worker  # ranks above 0 answer /health without meaning it
    assert svc["spec"]["selector"] == {
        "leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"],
        "role": "leader",
    }
    assert lwt["leaderTemplate"]["metadata"]["labels"]["role"] == "leader"
    assert svc["spec"]["ports"][0]["targetPort"] == 30000


def test_vllm_workers_are_headless_with_lws_master_addr() -> None:
    lws, _ = _docs(EUGR, "eugr")
    leader, worker = _container(lws, "leader"), _container(lws, "worker")
    assert _flag(leader["command"], "--master-addr") == "$(SPARKFLEET_HOST_IP)"
    assert _flag(worker["command"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert "--headless" in worker["command"] and "--headless" not in leader["command"]
    assert _flag(worker["command"], "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert "--port" not in worker["command"]


def test_secrets_come_from_a_secret_never_the_manifest() -> None:
    data = {"engine": "vllm", "model": "m/x", "docker_image": "img:1", "env": {"HF_TOKEN": "hf_supersecret"}}
    recipe = parse_recipe(data, "r.toml")
    text = k8s_yaml(recipe, "x")
    assert "hf_supersecret" not in text and "x-secrets" in text
    lws, _ = yaml.safe_load_all(text)
    env = {e["name"]: e for e in _container(lws, "leader")["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "x-secrets", "key": "HF_TOKEN"}


def test_process_recipe_needs_an_image_and_llamacpp_workers_are_rpc_servers() -> None:
    data = {
        "engine": "llama-cpp",
        "model": "/models",
        "model_file": "g.gguf",
        "required_nodes": 2,
        "tensor_parallel_size": 2,
    }
    recipe = parse_recipe(data, "r.toml")
    with pytest.raises(RecipeError, match="docker_image: required"):
        k8s_manifests(recipe, "g")
    lws, svc = k8s_manifests(recipe, "g", K8sOptions(image="llama:cpu", gpus_per_node=0, rdma=False))
    _validate([lws, svc])
    leader, worker = _container(lws, "leader"), _container(lws, "worker")
    assert _flag(leader["command"], "--rpc") == "g-0-1.g:50052"
    # Pods start together: the leader waits until every rpc-server it names accepts connections.
    assert leader["command"][:2] == ["bash", "-c"] and leader["command"][3:5] == ["wait-rpc", "g-0-1.g:50052"]
    assert leader["command"][5] == "llama-server"
    assert worker["command"][:5] == ["rpc-server", "--host", "$(SPARKFLEET_HOST_IP)", "--port", "50052"]
    assert worker["readinessProbe"] == {"tcpSocket": {"port": 50052}, "periodSeconds": 10}
    assert "resources" not in leader and leader["readinessProbe"]["httpGet"]["path"] == "/health"


def test_schemas_reject_what_the_api_server_would() -> None:
    lws, svc = _docs(MIA, "mia")
    broken = copy.deepcopy(lws)
    broken["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["hostNetwok"] = True
    assert not LWS.is_valid(broken)
    broken = copy.deepcopy(lws)
    del broken["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert not LWS.is_valid(broken)
    broken = copy.deepcopy(lws)
    _container(broken, "leader")["resources"]["limits"]["nvidia.com/gpu"] = "one"
    assert not LWS.is_valid(broken)
    broken = copy.deepcopy(svc)
    broken["spec"]["ports"][0]["port"] = 70000
    assert not SERVICE.is_valid(broken)


def test_names_are_dns_labels() -> None:
    assert k8s_name("DeepSeek V4.1_flash!") == "deepseek-v4-1-flash"
    assert k8s_name("42x") == "sf-42x"


def test_cli_export_k8s_writes_a_file(tmp_path: Path) -> None:
    out = tmp_path / "lws.yaml"
    cmd = [sys.executable, "-m", "sparkfleet.cli.main", "export", "k8s", str(MIA), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    _validate(list(yaml.safe_load_all(out.read_text())))


def _kubelet_expand(text: str, env: dict[str, str]) -> str:
    """kubelet's $(VAR) expansion (k8s third_party/forked/golang/expansion): $$ is one $, $(NAME)
    of a defined NAME is its value, anything else stays as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def test_literal_dollar_paren_is_escaped_for_kubelet() -> None:
    data = {
        "engine": "vllm",
        "model": "m/x",
        "docker_image": "img:1",
        "required_nodes": 2,
        "tensor_parallel_size": 2,
        "entrypoint": ["bash", "-c", 'echo "$(HF_TOKEN)" $$ $HOME; exec vllm serve "$@"', "vllm"],
        "args": ["--chat-template", "$(HF_TOKEN)", "--x", "a$$(b)c$"],
        "env": {"HF_TOKEN": "hf_secret", "WRAPPED": "pre-$(HF_TOKEN)-post", "PLAIN": "$HOME/x"},
    }
    text = k8s_yaml(parse_recipe(data, "r.toml"), "esc")
    assert "\x00" not in text and "\\0" not in text
    lws, _ = yaml.safe_load_all(text)
    pods = {"LWS_LEADER_ADDRESS": "10.1.0.1", "LWS_WORKER_INDEX": "1", "SPARKFLEET_HOST_IP": "10.1.0.2",
            "HF_TOKEN": "hf_secret"}  # fmt: skip
    for role in ("leader", "worker"):
        container = _container(lws, role)
        argv = container["command"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert "$$(HF_TOKEN)" in argv and "a$$$$(b)c$" in argv
        assert env["WRAPPED"] == "pre-$$(HF_TOKEN)-post" and env["PLAIN"] == "$HOME/x"
        expanded = [_kubelet_expand(w, pods) for w in argv]
        # What the container receives is what the recipe wrote; only sparkfleet's own references expand.
        assert expanded[:3] == ["bash", "-c", data["entrypoint"][2]]
        assert "$(HF_TOKEN)" in expanded and "a$$(b)c$" in expanded and "hf_secret" not in " ".join(expanded)
        assert _kubelet_expand(env["WRAPPED"], pods) == "pre-$(HF_TOKEN)-post"
        assert env["VLLM_HOST_IP"] == "$(SPARKFLEET_HOST_IP)"
    leader, worker = _container(lws, "leader")["command"], _container(lws, "worker")["command"]
    assert _flag(leader, "--master-addr") == "$(SPARKFLEET_HOST_IP)"
    assert _flag(worker, "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert _kubelet_expand(_flag(worker, "--master-addr"), pods) == "10.1.0.1"


def _pod_env(container: dict[str, Any], pod: dict[str, str]) -> dict[str, str]:
    """The container's env as kubelet gives it to the process (downward API values from pod)."""
    out: dict[str, str] = {}
    for e in container["env"]:
        if "valueFrom" in e:
            out[e["name"]] = pod[e["name"]]
        else:
            out[e["name"]] = _kubelet_expand(e["value"], {**pod, **out})
    return out


def test_ray_head_advertises_the_address_vllm_binds() -> None:
    data = {"engine": "vllm", "model": "m/x", "docker_image": "img:1", "required_nodes": 2,
            "tensor_parallel_size": 2, "distributed_backend": "ray"}  # fmt: skip
    lws, _ = k8s_manifests(parse_recipe(data, "r.toml"), "ray")
    _validate([lws, _])
    pods = {"LWS_LEADER_ADDRESS": "ray-0.ray", "LWS_WORKER_INDEX": "1"}
    leader = _container(lws, "leader")
    env = _pod_env(leader, {**pods, "SPARKFLEET_HOST_IP": "10.1.0.1"})
    script = _kubelet_expand(leader["command"][2], {**pods, **env})
    node_ip = script.split("--node-ip-address=", 1)[1].split()[0].strip("'")
    assert node_ip == env["VLLM_HOST_IP"] == "10.1.0.1"
    worker = _container(lws, "worker")
    wenv = _pod_env(worker, {**pods, "SPARKFLEET_HOST_IP": "10.1.0.2"})
    join = _kubelet_expand(worker["command"][2], {**pods, **wenv})
    assert "--address='ray-0.ray:29501'" in join and "--node-ip-address='10.1.0.2'" in join
    assert wenv["VLLM_HOST_IP"] == "10.1.0.2"


def _crd_validator() -> jsonschema.Draft7Validator:
    """The upstream LeaderWorkerSet CRD's v1 openAPIV3Schema (kubernetes-sigs/lws, vendored)."""
    import gzip

    with gzip.open(SCHEMAS / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz") as fh:
        crd = yaml.safe_load(fh)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = v1["schema"]["openAPIV3Schema"]
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


CRD = _crd_validator()
_RAY = {"engine": "vllm", "model": "m/x", "docker_image": "img:1", "required_nodes": 2, "tensor_parallel_size": 2,
        "distributed_backend": "ray", "revision": "a" * 40}  # fmt: skip
_LLAMA = {"engine": "llama-cpp", "model": "/models", "model_file": "g.gguf", "required_nodes": 3,
          "tensor_parallel_size": 3, "docker_image": "llama:cpu"}  # fmt: skip


@pytest.mark.parametrize("source", ["mia", "eugr", "ray", "llama"])
def test_manifests_validate_against_the_full_upstream_crd(source: str) -> None:
    if source in ("mia", "eugr"):
        lws, _ = _docs(MIA if source == "mia" else EUGR, source)
    else:
        lws, _ = k8s_manifests(parse_recipe(_RAY if source == "ray" else _LLAMA, "r.toml"), source)
    errors = sorted(CRD.iter_errors(lws), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


def test_full_crd_rejects_what_the_api_server_would() -> None:
    lws, _ = _docs(MIA, "mia")
    for path, bad in ((("leaderWorkerTemplate", "restartPolicy"), "Sometimes"),
                      (("leaderWorkerTemplate", "size"), "four"), (("startupPolicy",), "Eventually")):  # fmt: skip
        broken = copy.deepcopy(lws)
        target = broken["spec"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = bad
        assert not CRD.is_valid(broken), path
    broken = copy.deepcopy(lws)
    del broken["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["name"]
    assert not CRD.is_valid(broken)


def test_staged_host_paths_follow_the_state_dir() -> None:
    data = {"engine": "vllm", "model": "m/x", "docker_image": "img:1",
            "extra_mounts": [{"host": "{{state}}/staged/{{name}}", "container": "/staged", "read_only": True}],
            "staging": [{"kind": "sync", "id": "w", "src": "/data/w", "dst": "{{state}}/staged/{{name}}"}]}  # fmt: skip
    recipe = parse_recipe(data, "r.toml")

    def host_path(lws: dict[str, Any]) -> str:
        pod = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
        return next(v["hostPath"]["path"] for v in pod["volumes"] if v["name"].startswith("mount-"))

    lws, _ = k8s_manifests(recipe, "st")
    assert host_path(lws) == "/root/.local/state/sparkfleet/staged/st"
    lws, _ = k8s_manifests(recipe, "st", K8sOptions(state_dir="/srv/sf"))
    assert host_path(lws) == "/srv/sf/staged/st"
    cluster = parse_cluster({"name": "c", "defaults": {"state_dir": "/data/sf"}, "nodes": [{"name": "a", "host": "h"}]},
                            "c")  # fmt: skip
    text = k8s_yaml(recipe, "st", like=cluster.nodes[0])
    lws = next(yaml.safe_load_all(text))
    assert host_path(lws) == "/data/sf/staged/st" and "/data/sf/staged/st (state_dir /data/sf)" in text
