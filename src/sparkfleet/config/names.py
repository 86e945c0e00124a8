"""What a name, host, user or env value from a file may be before it reaches a command line,
a path or a record.

A host that begins with ``-`` is an ssh option (OpenSSH before 9.6 runs a ``-oProxyCommand=``
given as the destination); one with a space is two words to every tool that splits; a
deployment name with ``/`` or ``..`` is a path outside the state dir; an env value with a
newline is two lines of an env file. Each is refused when the file is read, with the key path.
"""

from __future__ import annotations

import ipaddress
import re

# RFC 1123 labels (underscores tolerated: ssh_config aliases and some lab DNS use them).
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})")
# POSIX portable user names (plus Samba's trailing $).
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
DEPLOYMENT = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_VALUE = 32 * 1024  # one env value or argv word: far above any real one, far below ARG_MAX
MAX_DEPTH = 32  # tables and arrays nested in a recipe or cluster file


# An importer's ``<SET ME: …>`` (config/placeholders.py): loads, and plan refuses it by key.
_PLACEHOLDER = re.compile(r"<SET ME: [^>]*>")


def host(value: str) -> str:
    """A host name or IP address that no tool can read as an option or two words."""
    if _PLACEHOLDER.fullmatch(value):
        return value
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOST.fullmatch(value) or ".." in value:
        raise ValueError(f"{value!r} is not a host name or IP address (letters, digits, '.', '-', '_'; "
                         "not starting with '-')")  # fmt: skip
    return value


def user(value: str) -> str:
    if not _USER.fullmatch(value) and not _PLACEHOLDER.fullmatch(value):
        raise ValueError(f"{value!r} is not a user name (letters, digits, '_', '.', '-'; not starting with '-')")
    return value


def node_name(value: str) -> str:
    if not _NODE.fullmatch(value) or value in (".", ".."):
        raise ValueError(f"{value!r} is not a node name (letters, digits, '_', '.', '-'; up to 63)")
    return value


def deployment(value: str) -> str:
    """A deployment name: a folder, a container name and a label on every node."""
    if not DEPLOYMENT.fullmatch(value) or ".." in value:
        raise ValueError(
            f"deployment name {value!r} must be lowercase letters, digits, '.', '_' or '-' (up to 63, starting "
            "with a letter or digit)"
        )
    return value


def derived_deployment(stem: str) -> str:
    """A deployment name from a recipe's folder or file name: lowercased, other characters as '-'."""
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).lstrip("._-")[:63].replace("..", "-")
    return name or "deployment"


def env(values: dict[str, str]) -> dict[str, str]:
    """An env table whose keys are variable names and values fit on one line of an env file."""
    for key, value in values.items():
        if not _ENV_KEY.fullmatch(key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
        if "\n" in value or "\r" in value or "\0" in value:
            raise ValueError(f"{key}: an env value cannot hold a newline or NUL (it is one line of an env file)")
        if len(value) > MAX_VALUE:
            raise ValueError(f"{key}: value of {len(value)} characters is over the {MAX_VALUE} limit")
    return values


def depth(data: object, limit: int = MAX_DEPTH) -> int:
    """How deeply data nests (ValueError past limit), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            raise ValueError(f"nested more than {limit} tables/arrays deep")
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, level + 1) for v in item)
    return deepest
