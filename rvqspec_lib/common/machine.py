"""What machine this is: THE one reader of ``/proc/cpuinfo`` (CPU model, feature flags), read once per process, for
the figures' CPU name, the precisions a CPU runs natively and the compiled kernels' cache key."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=4)
def _first_fields(path: str) -> dict:
    """The first value of each ``key : value`` line of a cpuinfo file (one processor's block); ``{}`` if unreadable."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip().lower(), value.strip())
    return out


def cpu_model(cpuinfo: str | Path = CPUINFO) -> str:
    """Human-readable CPU model (``model name`` of ``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    return _first_fields(str(cpuinfo)).get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_flags(cpuinfo: str | Path = CPUINFO) -> frozenset[str]:
    """The CPU's feature flags (the first ``flags`` line), lower case, e.g. ``"avx512_bf16"``; empty where the file
    is absent or has no such line (not Linux, or not x86)."""
    return frozenset(_first_fields(str(cpuinfo)).get("flags", "").lower().split())


def cpu_tag(cpuinfo: str | Path = CPUINFO) -> bytes:
    """Bytes that change when the CPU's instructions do (its flags line): part of a compiled kernel's cache key."""
    return _first_fields(str(cpuinfo)).get("flags", "").encode()
