"""Join the node-side staging modules into one stdlib-only script to ship to a node.

Nodes do not have sparkfleet installed. The node-side modules import each other only through
``from sparkfleet.apply.staging.<module> import …`` lines; dropping those lines and concatenating the
modules in dependency order gives one script whose names are the same as in the package.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

# Dependency order: each module uses only names from the ones before it.
NODE_MODULES = ("failure", "safetensors_index", "ledger", "disk", "layouts", "sparse_rows")
_INTERNAL_IMPORT = re.compile(r"^from sparkfleet\.nodes\.shipped\.\w+ import (\([^)]*\)|[^\n]*)\n", re.M)
_FUTURE = "from __future__ import annotations\n"


@functools.cache
def worker_source() -> bytes:
    """The staging worker script (``python3 - '<json>'`` runs it with the script on stdin)."""
    here = Path(__file__).resolve().parents[2] / "nodes" / "shipped"
    parts = [_FUTURE]
    for name in NODE_MODULES:
        text = (here / f"{name}.py").read_text(encoding="utf-8")
        text = _INTERNAL_IMPORT.sub("", text.replace(_FUTURE, "", 1))
        if "sparkfleet" in re.sub(r"#.*|\"\"\"[\s\S]*?\"\"\"", "", text).replace("sparkfleet-", ""):
            raise AssertionError(f"nodes/shipped/{name}.py refers to sparkfleet outside its imports")
        parts.append(f"# ---- {name}.py ----\n{text}")
    return "\n".join(parts).encode()
