"""Atomic output files: a result appears whole or not at all (docs/style.md#results-and-provenance), through a
temporary file in the SAME folder (``os.replace`` is then an atomic rename); and the one JSON writer, whose text is
strict JSON (RFC 8259: NaN and infinities become ``null``), used by everything the project writes as JSON."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence


def usual_mode(path: str | os.PathLike, base: int = 0o666) -> Path:
    """Give a file the permissions a plain ``open()`` would (``base`` less the umask): ``tempfile`` writes 0600."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, base & ~mask)
    return Path(path)


def temp_beside(path: str | os.PathLike) -> Path:
    """An empty new hidden file ``.<name>.<random>.part<suffix>`` beside ``path`` (OSError: folder missing or
    read-only)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.",
                               suffix=f".part{p.suffix}")
    os.close(fd)
    return Path(tmp)


@contextlib.contextmanager
def atomic_outputs(paths: Sequence[str | os.PathLike]) -> Iterator[list[Path]]:
    """Write several files all-or-nothing: yields a temporary path per target, moved onto the targets when the block
    ends cleanly, all removed when it raises (Ctrl-C included). Raises OSError: a folder missing or read-only."""
    targets = [Path(p) for p in paths]
    temps: list[Path] = []
    try:
        for t in targets:
            temps.append(temp_beside(t))
        yield temps
        for tmp, target in zip(temps, targets):
            usual_mode(tmp)
            os.replace(tmp, target)
    finally:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """:func:`atomic_outputs` for one file: ``with atomic_output("x.json") as tmp: tmp.write_text(...)``."""
    with atomic_outputs([path]) as (tmp,):
        yield tmp


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """``Path(path).write_text(text)``, atomically (:func:`atomic_output`). Returns ``Path(path)``."""
    with atomic_output(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def json_types(x: Any) -> Any:
    """``x`` as JSON types: mappings (keys as ``str``), lists (tuples, sets), finite floats, str, int, bool, None;
    NaN and infinities become ``None``, numpy/torch scalars and arrays their values, paths and anything else ``str``."""
    if isinstance(x, Mapping):
        return {str(k): json_types(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [json_types(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, os.PathLike):
        return str(x)
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:  # numpy / torch scalar
        return json_types(x.item())
    if hasattr(x, "tolist"):
        return json_types(x.tolist())
    return str(x)


def json_text(obj: Any, *, indent: int | None = 1, **kw) -> str:
    """Strict JSON text of ``obj`` after :func:`json_types` (no NaN or Infinity: every parser reads it); ``kw`` as
    ``json.dumps`` (``sort_keys``, ``ensure_ascii``). No trailing newline."""
    return json.dumps(json_types(obj), indent=indent, allow_nan=False, **kw)


def write_json_atomic(path: str | os.PathLike, obj: Any, *, indent: int | None = 1, **kw) -> Path:
    """Write :func:`json_text` of ``obj`` and a newline to ``path``, atomically. Returns ``Path(path)``."""
    return write_text_atomic(path, json_text(obj, indent=indent, **kw) + "\n")
