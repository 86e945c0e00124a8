"""Where this machine keeps Hugging Face models and sparkfleet's engine environments.

One resolver for everything that looks: the set-up (``scripts/prepare-model.py`` places the
test model), the local cluster (``cluster.local_cluster``: the node's ``hf_cache``), and the
tests' skip checks. If each read the environment its own way, setting ``HF_HUB_CACHE`` would
place the model in one folder and skip every test that looks in another.

The Hugging Face rules are huggingface_hub's own (``huggingface_hub.constants``):

- ``HF_HUB_CACHE`` (or the older ``HUGGINGFACE_HUB_CACHE``) names the hub cache itself;
- otherwise it is ``$HF_HOME/hub``, with ``HF_HOME`` defaulting to
  ``$XDG_CACHE_HOME/huggingface`` and ``XDG_CACHE_HOME`` to ``~/.cache``.

sparkfleet's node setting ``hf_cache`` is the folder *above* the hub cache (models are read
from ``<hf_cache>/hub/models--org--name``, the way engines read ``$HF_HOME/hub``), so a hub
cache that is not named ``hub`` cannot be a node's cache: :func:`local_hf_cache` says so.

The engine environments live in ``$SPARKFLEET_CACHE`` (default ``~/.cache/sparkfleet``, as in
``scripts/setup-engines.sh``).

Standard library only and no sparkfleet imports, so the set-up scripts load it with any Python
(``sys.path.insert(0, "src")``) before the project is installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

HUB_DIRNAME = "hub"


def _get(env: Mapping[str, str] | None, name: str) -> str | None:
    value = (os.environ if env is None else env).get(name)
    return value or None  # an empty variable counts as unset


def _path(value: str, env: Mapping[str, str] | None) -> Path:
    home = _get(env, "HOME")
    if value == "~" or value.startswith("~/"):
        value = (home or str(Path.home())) + value[1:]
    return Path(value)


def _home(env: Mapping[str, str] | None) -> Path:
    home = _get(env, "HOME")
    return Path(home) if home else Path.home()


def hf_home(env: Mapping[str, str] | None = None) -> Path:
    """``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``."""
    value = _get(env, "HF_HOME")
    if value:
        return _path(value, env)
    xdg = _get(env, "XDG_CACHE_HOME")
    return (_path(xdg, env) if xdg else _home(env) / ".cache") / "huggingface"


def hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The folder holding ``models--org--name`` repos: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``."""
    value = _get(env, "HF_HUB_CACHE") or _get(env, "HUGGINGFACE_HUB_CACHE")
    return _path(value, env) if value else hf_home(env) / HUB_DIRNAME


def repo_dir(repo: str, env: Mapping[str, str] | None = None) -> Path:
    """``<hub cache>/models--org--name`` for a repo id ``org/name``."""
    return hub_cache(env) / ("models--" + repo.replace("/", "--"))


def local_hf_cache(env: Mapping[str, str] | None = None) -> Path:
    """This machine's ``hf_cache`` as a sparkfleet node: the folder whose ``hub/`` is the hub cache.

    Raises ValueError when the hub cache is not named ``hub`` (``HF_HUB_CACHE=/data/models``):
    sparkfleet mounts ``<hf_cache>`` and engines read ``<hf_cache>/hub``, so no node setting
    could reach those models.
    """
    hub = hub_cache(env)
    if hub.name != HUB_DIRNAME:
        which = "HF_HUB_CACHE" if _get(env, "HF_HUB_CACHE") else "HUGGINGFACE_HUB_CACHE"
        raise ValueError(
            f"{which}={hub}: sparkfleet reads models from <hf_cache>/{HUB_DIRNAME}, so the hub cache must be a "
            f"folder named '{HUB_DIRNAME}' (e.g. {which}={hub / HUB_DIRNAME}), or unset it and set HF_HOME"
        )
    return hub.parent


def engine_cache(env: Mapping[str, str] | None = None) -> Path:
    """``$SPARKFLEET_CACHE``, else ``~/.cache/sparkfleet``: engine venvs, wheels, engines.env."""
    value = _get(env, "SPARKFLEET_CACHE")
    return _path(value, env) if value else _home(env) / ".cache" / "sparkfleet"
