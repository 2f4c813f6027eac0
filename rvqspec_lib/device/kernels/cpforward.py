"""Bindings of ``cpforward.c``: the code predictor's verify call and its linear layers in C, at the weight-streaming
floor (docs/precision.md#the-native-forward), built for the running CPU on first use (:class:`build.Library`); the
backends over it are :class:`rvqspec_lib.device.native.NativeCodePredictor` and
:class:`rvqspec_lib.device.native_talker.NativeTalker`. :func:`fast_precisions` says which precisions run through the
AVX-512 paths; the others run the plain C path of the same arithmetic layout.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

import torch

from rvqspec_lib.device.kernels import build

SOURCE = Path(__file__).with_name("cpforward.c")
CFLAGS = ("-O3", "-march=native", "-shared", "-fPIC")
#: The C precision codes, by the project's precision names (rvqspec_lib.device.precision.PRECISIONS).
PREC_CODE = {"float32": 0, "bfloat16": 1, "int8": 2, "int8-dynamic": 3}
#: Precisions whose official module computes in bfloat16: the C forward rounds where that arithmetic rounds.
BF16_ACTIVATIONS = ("bfloat16", "int8")
#: Which bits of ``rvq_caps()`` each precision's AVX-512 path needs (1 AVX512F, 2 AVX512-BF16, 4 AVX512-VNNI).
NEEDS_CAPS = {"float32": 1, "bfloat16": 1 | 2, "int8": 1 | 2, "int8-dynamic": 1 | 4}
#: Largest head width the C forward's per-row scratch holds.
MAX_HEAD_DIM = 1024

_p, _i, _f, _s = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_size_t
_SIGNATURES = {
    "rvq_caps": ([], _i),
    "rvq_packed_bytes": ([_i, _i, _i], _s),
    "rvq_pack": ([_i, _p, _i, _i, _p, _p], None),
    "rvq_linear_work": ([_i, _i, _i], _s),
    "rvq_linear": ([_i, _p, _p, _p, _i, _i, _p, _p, _i, _i, _p], None),
    "rvq_model_new": ([_i, _i, _i, _i, _i, _i, _i, _f, _i], _p),
    "rvq_model_free": ([_p], None),
    "rvq_model_set_linear": ([_p, _i, _i, _p, _p, _p, _i, _i], None),
    "rvq_model_set_norm": ([_p, _i, _i, _p], None),
    "rvq_model_set_kv_bf16": ([_p, _i], _i),
    "rvq_forward": ([_p, _p, _p, _p, _p, _p, _p, _p, _i, _i, _i, _p], _i),
    "rvq_forward_scan": ([_p, _p, _p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _p], _i),
    "rvq_frame_new": ([_p, _p, _p, _p, _i, _i, _p, _p, _p, _i], _p),
    "rvq_frame_run": ([_p, _p, _p, _i, _f, _i, _i, _i, _p, _p], _i),
    "rvq_frame_free": ([_p], None),
}


def _x86_64() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise RuntimeError(f"an x86-64 CPU is needed, this is {platform.machine()}")


_LIB = build.Library(SOURCE, CFLAGS, _SIGNATURES, _x86_64)


def available() -> bool:
    """Whether the library is built and loadable here (builds it on first call)."""
    return _LIB.load() is not None


def unavailable_reason() -> str | None:
    """Why the library cannot be used here (``None`` when it can)."""
    _LIB.load()
    return _LIB.reason


def lib():
    """The loaded library.

    Raises:
        RuntimeError: it cannot be built or loaded here (the reason, one line).
    """
    if _LIB.load() is None:
        raise RuntimeError(f"the native code-predictor forward is unavailable: {_LIB.reason}")
    return _LIB.lib


def fast_precisions() -> tuple[str, ...]:
    """Precisions that run through the AVX-512 paths of this build (the rest run through the plain C path)."""
    if _LIB.load() is None:
        return ()
    caps = _LIB.lib.rvq_caps()
    return tuple(p for p, need in NEEDS_CAPS.items() if caps & need == need)


def ptr(t: torch.Tensor | None) -> int | None:
    """The data pointer of a contiguous CPU tensor (``None`` for ``None``)."""
    return None if t is None else t.data_ptr()


class PackedLinear:
    """One linear layer's weights in the C kernels' panel layout (module docstring of ``cpforward.c``).

    Args:
        precision: a key of :data:`PREC_CODE`.
        weight: ``(N, K)``: float32 (``float32``; ``bfloat16``: values already bfloat16) or int8 (``int8``,
            ``int8-dynamic``).
        scale: ``(N,)`` per-channel scales (int8 precisions), float32.

    Attributes: ``n``, ``k``, ``data`` (uint8 buffer), ``scale``, ``comp`` (int8-dynamic's int32 correction, else
    ``None``): tensors the C calls read, kept alive here.
    """

    def __init__(self, precision: str, weight: torch.Tensor, scale: torch.Tensor | None = None):
        code = PREC_CODE[precision]
        int8 = precision in ("int8", "int8-dynamic")
        w = weight.detach().to(torch.int8 if int8 else torch.float32).contiguous().cpu()
        self.precision, self.code = precision, code
        self.n, self.k = int(w.shape[0]), int(w.shape[1])
        self.data = torch.empty(int(lib().rvq_packed_bytes(code, self.n, self.k)), dtype=torch.uint8)
        self.comp = torch.empty(self.n, dtype=torch.int32) if precision == "int8-dynamic" else None
        lib().rvq_pack(code, ptr(w), self.n, self.k, ptr(self.data), ptr(self.comp))
        self.scale = None if scale is None else scale.detach().to(torch.float32).contiguous().cpu()
        if int8 and self.scale is None:
            raise ValueError(f"an int8 layer needs its per-channel scales (precision {precision})")

    def __call__(self, x: torch.Tensor, *, act_bf16: bool) -> torch.Tensor:
        """``x`` ``(M, K)`` float32 contiguous -> ``(M, N)`` float32 (bfloat16 values when ``act_bf16``)."""
        m = int(x.shape[0])
        y = torch.empty(m, self.n, dtype=torch.float32)
        work = torch.empty(int(lib().rvq_linear_work(self.code, m, self.k)), dtype=torch.float32)
        lib().rvq_linear(self.code, ptr(self.data), ptr(self.scale), ptr(self.comp), self.n, self.k, ptr(x),
                         ptr(y), m, int(act_bf16), ptr(work))
        return y
