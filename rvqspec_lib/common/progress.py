"""Progress bars for long work: one helper so every loop shows (or hides) progress the same way. Bars go to
``sys.stderr`` (live in a terminal or JupyterLab) unless ``RVQSPEC_PROGRESS=console`` (the Makefile's papermill rule):
then every tqdm bar of the process goes to the console that started it, never into the executed notebook.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Iterable, TypeVar

from tqdm import tqdm

T = TypeVar("T")

#: The environment variable that routes progress bars: ``console`` (headless notebook runs), else the default.
PROGRESS_ENV = "RVQSPEC_PROGRESS"
_console: IO[str] | None = None


def progress_file() -> IO[str] | None:
    """The stream bars write to: under ``RVQSPEC_PROGRESS=console`` the console (the process's original standard
    error, which a Jupyter kernel's ``sys.stderr.fileno()`` names: not the notebook), else ``None`` (tqdm's default,
    ``sys.stderr``). Raises ValueError: another value of the variable."""
    global _console
    mode = os.environ.get(PROGRESS_ENV, "")
    if mode not in ("", "console"):
        raise ValueError(f"{PROGRESS_ENV}={mode!r}: set it to 'console' (bars to the console) or leave it unset")
    if mode != "console":
        return None
    if _console is None:
        _console = open(sys.stderr.fileno(), "w", buffering=1, closefd=False)  # noqa: SIM115 (kept for the process)
    return _console


def _route_every_bar(console, init=tqdm.__init__) -> None:
    """tqdm bars created without a ``file`` (the library's and other libraries') write to ``console``."""
    def __init__(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "file": kwargs.get("file") or console})
    tqdm.__init__ = __init__


if progress_file() is not None:
    _route_every_bar(progress_file())


def progress_bar(iterable: Iterable[T], *, total: int | None = None, desc: str = "", enabled: bool = True,
             unit: str = "it") -> Iterable[T]:
    """``iterable`` in a plain tqdm bar when ``enabled`` (else unchanged): ``desc`` its label, ``total`` its length
    when ``len()`` does not give it, ``unit`` what one step is; the bar writes to :func:`progress_file`."""
    if not enabled:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, unit=unit, file=progress_file())
