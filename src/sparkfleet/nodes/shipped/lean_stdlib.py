"""Stand-ins for the standard-library pieces whose import costs a node program more than its work.

Every node program is a fresh interpreter per call, and what it imports is paid on every call:
``json`` compiles its regular expressions (``re`` and ``enum``, ~10 ms on the 2-core test VM),
``typing`` pulls in ``re``, ``contextlib`` and ``warnings`` (~4 ms more), ``hashlib`` loads
OpenSSL (~3 ms). A re-stage of unchanged outputs spent about as long importing those as checking
the outputs. Each stand-in here does what its program needs of the module, through the module's
own C core where there is one, and falls back to the module itself for anything else.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any
    from typing import NamedTuple as NamedRecord


def _json_codec():  # type: ignore[no-untyped-def]
    """(loads, dumps) through the C accelerator ``_json`` (what the json package itself calls),
    without json's import; the json package where ``_json`` is missing or its signature differs."""
    try:
        import _json

        class _Scanning:  # the attributes json.JSONDecoder hands the C scanner
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = float  # NaN, Infinity, -Infinity

        scan = _json.make_scanner(_Scanning())

        def _unencodable(obj):  # type: ignore[no-untyped-def]
            raise TypeError(f"{type(obj).__name__} is not JSON serializable")

        encode = _json.make_encoder(None, _unencodable, _json.encode_basestring_ascii, None, ": ", ", ",
                                    False, False, True)  # fmt: skip

        def loads(text):  # type: ignore[no-untyped-def]
            if isinstance(text, (bytes, bytearray)):
                text = text.decode("utf-8")
            start = len(text) - len(text.lstrip())
            try:
                obj, end = scan(text, start)
            except StopIteration as stop:  # the scanner's "no value here"
                raise ValueError(f"expecting a JSON value at {stop.value}") from None
            if text[end:].strip():
                raise ValueError(f"extra data after JSON at {end}")
            return obj

        def dumps(obj) -> str:  # type: ignore[no-untyped-def]
            return "".join(encode(obj, 0))

        if loads(dumps({"a": [1, 2.5, None, True, "\u00e9"]})) == {"a": [1, 2.5, None, True, "\u00e9"]}:
            return loads, dumps
    except (ImportError, AttributeError, TypeError, ValueError, StopIteration):
        pass
    import json

    return json.loads, json.dumps


json_loads, json_dumps = _json_codec()


def glob_match(name: str, pattern: str) -> bool:
    """``fnmatch.fnmatchcase(name, pattern)``; patterns with ``*`` and ``?`` only are matched here,
    as fnmatch translates every pattern into a regular expression (importing ``re``)."""
    if "[" in pattern:
        import fnmatch

        return fnmatch.fnmatchcase(name, pattern)
    n = p = 0
    star, resume = -1, 0  # the last ``*`` seen, and where in name its match would end next
    while n < len(name):
        if p < len(pattern) and pattern[p] == "*":
            star, resume = p, n
            p += 1
        elif p < len(pattern) and pattern[p] in ("?", name[n]):
            n += 1
            p += 1
        elif star >= 0:
            resume += 1  # the last ``*`` takes one more character; the rest is matched again
            n, p = resume, star + 1
        else:
            return False
    return pattern[p:].strip("*") == ""


def sha256_hex(data: bytes) -> str:
    """``hashlib.sha256(data).hexdigest()`` through the built-in module, not OpenSSL's."""
    try:
        from _sha256 import sha256  # CPython 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # CPython 3.12+
        except ImportError:
            from hashlib import sha256
    return str(sha256(data).hexdigest())


class _RecordType(type):
    """Makes ``class X(NamedRecord): a: int …`` the ``collections.namedtuple`` that
    ``typing.NamedTuple`` would make, methods and properties kept."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> Any:
        if not bases:
            return super().__new__(mcs, name, bases, namespace)
        import collections

        fields = tuple(namespace.get("__annotations__", {}))
        defaults = [namespace[f] for f in fields if f in namespace]
        module = namespace.get("__module__")
        base = collections.namedtuple(name, fields, defaults=defaults, module=module)  # type: ignore[misc]
        body = {k: v for k, v in namespace.items() if k not in fields and k != "__annotations__"}
        return type(name, (base,), {**body, "__slots__": ()})


if not TYPE_CHECKING:

    class NamedRecord(metaclass=_RecordType):
        """``typing.NamedTuple`` for node programs (see ``_RecordType``)."""
