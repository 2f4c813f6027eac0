"""Compile a C source shipped in this folder into a shared library in the cache folder, once per source, compiler,
flags and CPU (the kernels are built for the running CPU's instructions), and never load a half-written one.

Used by ``cpforward`` and ``snake`` (:class:`Library`); the CPU's tag is :func:`rvqspec_lib.common.machine.cpu_tag`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from rvqspec_lib.common.machine import cpu_tag


def cache_dir() -> Path:
    """Where compiled kernels go: ``$RVQSPEC_CACHE`` or ``~/.cache/rvqspec``."""
    return Path(os.environ.get("RVQSPEC_CACHE") or Path.home() / ".cache" / "rvqspec").expanduser()


def build(source: Path, cflags: tuple[str, ...], *, stem: str | None = None) -> Path:
    """Compile ``source`` with ``cc *cflags`` into the cache folder unless a library of the same source, compiler,
    flags and CPU is there; return its path.

    The library is written to a temporary file and renamed: another process never sees a half-written library.

    Raises:
        RuntimeError: no C compiler on ``PATH`` (``$CC``, ``cc``, ``gcc``), the compiler failed (its first line), or
            the cache folder cannot be written (naming ``RVQSPEC_CACHE``).
    """
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    src = Path(source).read_bytes()
    tag = hashlib.sha256(src + " ".join((compiler,) + tuple(cflags)).encode() + cpu_tag()).hexdigest()[:12]
    out = cache_dir() / f"{stem or Path(source).stem}-{tag}.so"
    if out.is_file():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    except OSError as e:
        raise RuntimeError(f"the compiled kernel cannot be written to {out.parent} ({e.strerror}): set RVQSPEC_CACHE "
                           "to a writable folder") from None
    os.close(fd)
    try:
        r = subprocess.run([compiler, *cflags, "-o", tmp, str(source)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {(r.stderr or r.stdout).strip().splitlines()[0][:200]}")
        os.replace(tmp, out)  # atomic
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


class Library:
    """A shipped C source built (:func:`build`) and loaded on first use, its functions typed from ``signatures``
    (``{name: (argtypes, restype)}``); ``check()`` may raise ``RuntimeError`` first (e.g. the wrong CPU)."""

    def __init__(self, source: Path, cflags: tuple[str, ...], signatures: dict, check=None):
        self.source, self.cflags, self.signatures, self.check = source, cflags, signatures, check
        self.lib, self.reason = None, None

    def load(self):
        """The ``ctypes`` library, or ``None`` when it cannot be built or loaded here (:attr:`reason` says why)."""
        if self.lib is None and self.reason is None:
            try:
                if self.check is not None:
                    self.check()
                lib = ctypes.CDLL(str(build(self.source, self.cflags)))
                for name, (args, res) in self.signatures.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = args, res
                self.lib = lib
            except (OSError, RuntimeError) as e:
                self.reason = str(e)
        return self.lib
