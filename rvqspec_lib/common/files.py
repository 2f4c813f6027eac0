"""Atomic output files: a result appears whole or not at all (docs/style.md, "never a half-written output file").

Every writer goes through :func:`atomic_output`: the bytes go to a temporary file in the SAME folder (so the final
``os.replace`` is a rename on one file system, atomic on POSIX and Windows), and the temporary file is removed when
anything fails before the rename, Ctrl-C (``KeyboardInterrupt``) included.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Sequence


def usual_mode(path: str | os.PathLike, base: int = 0o666) -> Path:
    """Give a written file the permissions a plain ``open()`` would (``base`` 0666 minus the umask; 0777 for a
    folder). safetensors and ``tempfile.mkstemp`` write files 0600 (``mkdtemp`` folders 0700), so a model, drafter or
    result saved on a shared machine would be unreadable to the other users."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, base & ~mask)
    return Path(path)


def temp_beside(path: str | os.PathLike) -> Path:
    """An empty new file in ``path``'s folder, named ``.<name>.<random>.part<suffix>``: hidden, and with ``path``'s
    suffix, so writers that pick the format by extension (soundfile, ``np.save``) write the right one.

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
    """Write several files all-or-nothing: yields one temporary path per target (same folder, same suffix); when the
    block ends without an exception every temporary file is moved onto its target with ``os.replace``; when it
    raises (``KeyboardInterrupt`` included) every temporary file is removed and no target is touched.

    Args:
        paths: the final files; their folders must exist.

    Yields:
        ``list[Path]``: the temporary files to write, in the order of ``paths``.

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
