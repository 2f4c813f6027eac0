"""What machine this is: THE one reader of ``/proc/cpuinfo`` (CPU model, feature flags), read once per process, for
the figures' CPU name, the precisions a CPU runs natively and the compiled kernels' cache key; which devices are
present (``--device auto|cuda|mps|cpu``) and the dtype a model loads in on one (:func:`load_dtype`)."""

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


#: CPU flags (as /proc/cpuinfo spells them) that give native bfloat16 arithmetic: x86's, and Arm's ``bf16`` feature.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
_ARM_BF16 = "bf16"


def native_bfloat16(cpuinfo: str | Path = CPUINFO) -> bool:
    """Whether the CPU computes in bfloat16 natively (x86 :data:`BF16_FLAGS`, or Arm's ``bf16`` in the ``Features``
    line); False where neither line says so (an older CPU, or no ``/proc/cpuinfo``: macOS runs models on MPS), and
    False where this process's kernels are pinned below it (:func:`kernels_pinned`: ``make paper`` pins notebooks 00
    and 05 at AVX2 for the embedded model, where bfloat16 would be emulated)."""
    fields = _first_fields(str(cpuinfo))
    native = bool(cpu_flags(cpuinfo) & set(BF16_FLAGS)) or _ARM_BF16 in fields.get("features", "").lower().split()
    return native and not kernels_pinned()


def kernels_pinned() -> bool:
    """Whether this process's x86 matrix kernels are capped below native bfloat16 before Python started: oneDNN's
    ``ONEDNN_MAX_CPU_ISA`` (which runs torch's bfloat16 matrix products on the CPU) naming an instruction set without
    bfloat16 (``AVX2``, ``AVX512_CORE``, ...; ``ALL`` and the ``*_BF16``/``*_AMX`` sets are no cap below it)
    (docs/reproducibility.md#on-another-cpu)."""
    import os

    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    return bool(isa and isa != "ALL" and "BF16" not in isa and "AMX" not in isa)


def on_cpu(device: str = "auto") -> bool:
    """Whether ``device`` (``auto``, ``cpu``, ``cuda[:N]``, ``mps``) resolves to the CPU, which ``auto`` does on a
    machine with neither CUDA nor Apple's GPU (:func:`resolve_device`): where a full ``make paper`` on a real-size
    checkpoint takes the notebooks' CPU sizes. Raises ValueError: a device that is not present (one line)."""
    return resolve_device(device) == "cpu"


#: What ``--device`` accepts: ``auto`` picks the first present of ``cuda``, ``mps`` (Apple's GPU), ``cpu``.
DEVICES = ("auto", "cuda", "mps", "cpu")


def present_devices() -> tuple[str, ...]:
    """The device kinds torch can run on here, best first: ``cuda`` (an NVIDIA GPU), ``mps`` (Apple's GPU), ``cpu``."""
    import torch  # here, not at import: the command line's help never imports torch

    mps = getattr(torch.backends, "mps", None)
    return tuple(d for d, ok in (("cuda", torch.cuda.is_available()),
                                 ("mps", mps is not None and mps.is_available()), ("cpu", True)) if ok)


def resolve_device(name: str = "auto") -> str:
    """``auto`` -> the best present device (:func:`present_devices`: CUDA, then MPS, then the CPU); ``cpu``,
    ``cuda``, ``cuda:N``, ``mps`` -> themselves once checked present (``cpu:0``, torch's name of the CPU, is
    ``cpu``).

    Raises:
        ValueError: an unknown name, or a device that is not present here (one line naming those that are).
    """
    name = str(name).strip().lower()
    if name == "cpu:0":  # torch's and accelerate's name of the one CPU device
        name = "cpu"
    kind, _, index = name.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"unknown device {name!r}: use one of {', '.join(DEVICES)} (or cuda:N)")
    present = present_devices()
    if kind == "auto":
        return present[0]
    if kind not in present:
        raise ValueError(f"--device {name} is not present on this machine (it has {', '.join(present)}): use "
                         f"--device auto or one of those")
    if index:
        import torch

        if int(index) >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                             f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return name


def runs_well(dtype, device: str) -> bool:
    """Whether ``device`` (``cpu``, ``cuda[:N]``, ``mps``) computes in ``dtype`` (a torch float dtype) at full speed:
    float32 everywhere; bfloat16 on a CUDA GPU that supports it, on MPS, on a CPU with :func:`native_bfloat16`;
    float16 on GPUs only (CPUs emulate it). The rule of :func:`load_dtype`."""
    import torch

    kind = str(device).split(":")[0]
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        if kind == "cuda":
            return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return kind == "mps" or (kind == "cpu" and native_bfloat16())
    if dtype == torch.float16:
        return kind in ("cuda", "mps")
    return False


def load_dtype(stored, device: str):
    """THE dtype rule (docs/model.md#device-and-dtype): a model loads in the dtype its weights are stored in
    (``stored``, a torch dtype; ``None``: unknown, float32) where ``device`` runs it well (:func:`runs_well`), else in
    float32. Returns a torch dtype."""
    import torch

    stored = torch.float32 if stored is None else stored
    return stored if runs_well(stored, device) else torch.float32
