"""Atomic output files: a result appears whole or not at all (docs/style.md#results-and-provenance), through a
temporary file in the SAME folder (``os.replace`` is then an atomic rename)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Sequence


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
