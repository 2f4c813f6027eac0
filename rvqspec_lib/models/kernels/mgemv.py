"""The multi-row GEMV kernel (``mgemv.c``): ``y = x @ W.T`` for the few query rows of a verify call.

On a CPU with AVX2/FMA and no AVX-512 (the project's build machines), MKL's sgemm switches from its GEMV path at one
row to a general GEMM at two or more, so the cost of a code-predictor call jumps between Q = 1 and Q = 2
(docs/offline.md#verify-cost-on-this-cpu). ``mgemv.c`` streams each weight row once and multiplies it with every
query row while it is in L1 (blocks of 4 weight rows x 2 query rows).

Build: on first use, ``cc -O3 -mavx2 -mfma -shared -fPIC`` compiles the shipped source into the cache folder
(``$RVQSPEC_CACHE``, else ``~/.cache/rvqspec``) under a name that hashes the source and the flags, writing to a
temporary file first so that a half-built library is never loaded. Where it cannot be used (no C compiler, a CPU
without AVX2, a failed build) :func:`available` is ``False``, the reason is in :func:`unavailable_reason`, and
:func:`linear` falls back to ``torch.nn.functional.linear`` with a one-line warning (once).

The kernel is registered as the torch custom op ``rvqspec::mgemv`` so that it also runs inside ``torch.compile``
graphs (the op has a fake implementation for tracing).
"""

from __future__ import annotations

import ctypes
import platform
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from rvqspec_lib.models.kernels import build

SOURCE = Path(__file__).with_name("mgemv.c")
CFLAGS = ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC")
#: Rows (batch x query positions) up to which the kernel beats MKL on the build machines at one thread; above it
#: MKL's GEMM, which reuses each weight block across many rows, wins (measured by ``verify_cost_curve``; notes in
#: docs/offline.md#verify-cost-on-this-cpu).
MAX_ROWS = 64
#: Alignment the kernel needs: K a multiple of 8 (one AVX2 vector), N a multiple of 4 (one block of weight rows).
K_MULTIPLE, N_MULTIPLE = 8, 4

_lib = None
_reason: str | None = None
_warned = False


def cache_dir() -> Path:
    """Where compiled kernels go: ``$RVQSPEC_CACHE`` or ``~/.cache/rvqspec``."""
    return build.cache_dir()


def _build() -> Path:
    """Compile ``mgemv.c`` into the cache folder unless a library of the same source and flags is there."""
    return build.build(SOURCE, CFLAGS)


def _load():
    global _lib, _reason
    if _lib is not None or _reason is not None:
        return _lib
    try:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise RuntimeError(f"an x86-64 CPU is needed, this is {platform.machine()}")
        if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
            raise RuntimeError(f"the CPU lacks AVX2/FMA (torch reports {torch.backends.cpu.get_cpu_capability()})")
        lib = ctypes.CDLL(str(_build()))
        lib.rvqspec_mgemv.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3
        lib.rvqspec_mgemv.restype = None
        _lib = lib
    except (OSError, RuntimeError) as e:
        _reason = str(e)
    return _lib


def available() -> bool:
    """Whether the kernel is built and loadable on this machine (builds it on first call)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why the kernel cannot be used here (``None`` when it can)."""
    _load()
    return _reason


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``x @ w.T`` can go through the kernel: float32 CPU tensors, ``w`` contiguous, K and N aligned, at most
    :data:`MAX_ROWS` rows."""
    return (x.dtype == torch.float32 and w.dtype == torch.float32 and x.device.type == "cpu"
            and w.device.type == "cpu" and w.is_contiguous() and w.shape[1] % K_MULTIPLE == 0
            and w.shape[0] % N_MULTIPLE == 0 and x.numel() // x.shape[-1] <= MAX_ROWS)


def _run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    k, n = x.shape[-1], w.shape[0]
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], n, dtype=x.dtype)
    _lib.rvqspec_mgemv(w.data_ptr(), x2.data_ptr(), y.data_ptr(), n, k, x2.shape[0])
    return y.view(*x.shape[:-1], n)


@torch.library.custom_op("rvqspec::mgemv", mutates_args=())
def _mgemv_op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _run(x, w) if _load() is not None and usable(x, w) else F.linear(x, w)


@_mgemv_op.register_fake
def _(x, w):
    return x.new_empty(*x.shape[:-1], w.shape[0])


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` through the kernel when it applies (:func:`usable`), else through torch.

    Args:
        x: ``(..., K)``. w: ``(N, K)`` (an ``nn.Linear`` weight). b: ``(N,)`` bias or ``None``.

    Returns:
        ``(..., N)``, equal to ``F.linear`` up to float32 rounding (summation order differs).
    """
    if torch.compiler.is_compiling():
        y = _mgemv_op(x, w)  # the custom op keeps the call opaque to the compiler
    elif usable(x, w) and _load() is not None:
        y = _run(x, w)  # eager: skip the dispatcher
    else:
        _note_fallback()
        y = F.linear(x, w)
    return y if b is None else y + b


def _note_fallback() -> None:
    global _warned
    if _reason is not None and not _warned:
        _warned = True
        warnings.warn(f"rvqspec mgemv kernel unavailable ({_reason}); using torch's matmul instead", RuntimeWarning,
                      stacklevel=3)
