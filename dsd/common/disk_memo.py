"""A memo on disk for results that are pure functions of their inputs and of dsd's own code.

`disk_memo(namespace, key, compute, encode, decode)` returns the stored result for a JSON `key`
(which names every input and, through `source_fingerprint`, the code that computes it), else
computes and stores it, under `$DSD_CACHE_DIR` (docs/cli.md "Files dsd keeps between runs";
`off` turns it off). An unreadable entry is recomputed, an unwritable folder skipped, entries are
written whole; `shipped` is a read-only folder of entries that come with the package.

Not here: eviction (entries are a few kB, one per distinct input) or locking.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from dsd.common import strict_json
from dsd.common.atomic import atomic_write_json

T = TypeVar("T")
CACHE_DIR_ENV = "DSD_CACHE_DIR"


def cache_dir() -> Path | None:
    """Where entries live; None when the memo is off (`DSD_CACHE_DIR=off`)."""
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off") else Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "dsd"


def source_fingerprint(*modules: ModuleType) -> str:
    """sha256 of the modules' source files, in order: changes whenever one of them is edited."""
    digest = hashlib.sha256()
    for module in modules:
        source = getattr(module, "__file__", None)
        if source is None:
            raise ValueError(f"module {module.__name__} has no source file to fingerprint")
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()


def disk_memo(
    namespace: str,
    key: Any,
    compute: Callable[[], T],
    encode: Callable[[T], Any],
    decode: Callable[[Any], T],
    shipped: Path | None = None,
) -> T:
    """`compute()`, or its stored result for `key` (see the module docstring)."""
    folder = cache_dir()
    name = entry_name(key)
    path = None if folder is None else folder / namespace / f"{name}.json"
    stored = [where for where in (path, shipped and shipped / f"{name}.json") if where]
    for where in stored:
        try:
            return decode(json.loads(where.read_text(encoding="utf-8"))["value"])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            pass  # no entry yet, or an unreadable one: compute it (again)
    result = compute()
    if path is None:
        return result
    # a read-only or full disk costs a recomputation next time, nothing else; so does a result
    # with NaN or infinities (strict JSON has no such numbers, and null would not read back)
    with contextlib.suppress(OSError, ValueError):
        atomic_write_json(
            path, {"value": encode(result)}, indent=None, fsync=False, nonfinite="refuse"
        )
    return result


def entry_name(key: Any) -> str:
    """The file name (without .json) of `key`'s entry: sha256 of its canonical JSON."""
    return hashlib.sha256(strict_json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()
