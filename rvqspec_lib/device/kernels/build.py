"""Compile a C source shipped in this folder into a shared library in the cache folder (else a private temporary
folder), once per source, compiler, flags and CPU (the kernels are built for the running CPU's instructions), and
never load a half-written one; and :func:`note_slower`, the one line a command prints when a fast path is missing.

Used by ``cpforward`` and ``snake`` (:class:`Library`); the CPU's tag is :func:`rvqspec_lib.common.machine.cpu_tag`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from rvqspec_lib.common.machine import cpu_tag

_NOTED: set[str] = set()


def note_slower(what: str, why: str) -> None:
    """Print ``note: <what> is unavailable here (<why>) ...`` on stderr, once per process and ``what``: the command
    runs, slower than it would have (``why`` names the cause and the fix)."""
    if what not in _NOTED:
        _NOTED.add(what)
        print(f"note: {what} is unavailable here, so this runs slower: {why}", file=sys.stderr)


def cache_dir() -> Path:
    """Where compiled kernels go: ``$RVQSPEC_CACHE`` or ``~/.cache/rvqspec``."""
    return Path(os.environ.get("RVQSPEC_CACHE") or Path.home() / ".cache" / "rvqspec").expanduser()


def private_dir() -> Path:
    """A folder of this user's own under the temporary folder (``rvqspec-<uid>``, mode 0700), where kernels go when
    the cache folder cannot be written; a fresh ``mkdtemp`` folder when that name is taken by anything else."""
    d = Path(tempfile.gettempdir()) / f"rvqspec-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(d)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return d
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="rvqspec-kernels-"))


def build(source: Path, cflags: tuple[str, ...]) -> Path:
    """Compile ``source`` with ``cc *cflags`` into the cache folder (:func:`cache_dir`; where it cannot be written,
    :func:`private_dir`) unless a library of the same source, compiler, flags and CPU is there; return its path.

    The library is written to a temporary file and renamed: another process never sees a half-written library.

    Raises:
        RuntimeError: no C compiler on ``PATH`` (``$CC``, ``cc``, ``gcc``), the compiler failed (its first line), or
            no folder can be written (naming ``RVQSPEC_CACHE``); each message names the fix.
    """
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler on PATH ($CC, cc, gcc): install one (e.g. apt-get install gcc)")
    src = Path(source).read_bytes()
    tag = hashlib.sha256(src + " ".join((compiler,) + tuple(cflags)).encode() + cpu_tag()).hexdigest()[:12]
    name, failed = f"{Path(source).stem}-{tag}.so", []
    for folder in (cache_dir(), None):
        try:
            folder = private_dir() if folder is None else folder
            out = folder / name
            if out.is_file():
                return out
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
            break
        except OSError as e:
            failed.append(f"{folder or 'a temporary folder'} ({e.strerror})")
    else:
        raise RuntimeError(f"the compiled kernel cannot be written to {' nor to '.join(failed)}: set RVQSPEC_CACHE to "
                           "a writable folder")
    os.close(fd)
    try:
        r = subprocess.run([compiler, *cflags, "-o", tmp, str(source)], capture_output=True, text=True)
        if r.returncode != 0:
            said = (r.stderr or r.stdout).strip().splitlines() or [f"exit status {r.returncode}"]
            raise RuntimeError(f"{compiler} failed: {said[0][:200]} (set CC to another C compiler)")
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

    def load_or_note(self, what: str, instead: str):
        """:meth:`load`, for a caller that runs ``instead`` (slower) without it: then :func:`note_slower` once."""
        if self.load() is None:
            note_slower(what, f"{self.reason}; {instead}")
        return self.lib

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
