"""Atomic output files: a result appears whole or not at all (docs/style.md#results-and-provenance). Every writer
goes through :func:`atomic_outputs`: a temporary file in the SAME folder (so ``os.replace`` is an atomic rename),
removed when anything fails before the rename, Ctrl-C included."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Sequence


def usual_mode(path: str | os.PathLike, base: int = 0o666) -> Path:
    """Give a written file the permissions a plain ``open()`` would (``base`` less the umask; 0777 for a folder):
    safetensors and ``tempfile`` write 0600, unreadable to the other users of a shared machine."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, base & ~mask)
    return Path(path)


def temp_beside(path: str | os.PathLike) -> Path:
    """An empty new file in ``path``'s folder, ``.<name>.<random>.part<suffix>``: hidden, with ``path``'s suffix (for
    writers that pick the format by extension).

    Raises:
        OSError: the folder does not exist or is not writable.
    """
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.",
                               suffix=f".part{p.suffix}")
    os.close(fd)
    return Path(tmp)


@contextlib.contextmanager
def atomic_outputs(paths: Sequence[str | os.PathLike]) -> Iterator[list[Path]]:
    """Write several files all-or-nothing: yields one temporary path per target (same folder, same suffix), moved
    onto the targets when the block ends cleanly, all removed (no target touched) when it raises, Ctrl-C included.

    Raises:
        OSError: a folder is missing or read-only (before the block runs), or a rename fails.
    """
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
