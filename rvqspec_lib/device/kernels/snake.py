"""The fused SnakeBeta kernel (``snake.c``) of the streaming codec decoder's oneDNN backend
(:mod:`rvqspec_lib.device.streaming_layers`): ``y = x + inv_beta[c] * sin(alpha[c] * x)^2`` in one pass over
channels-last activations, float32 or bfloat16 (float32 inside). Built for the running CPU on first use
(:class:`rvqspec_lib.device.kernels.build.Library`); where it cannot be, :func:`snake` computes the same function with
torch operations (five passes over memory).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from rvqspec_lib.device.kernels import build

SOURCE = Path(__file__).with_name("snake.c")
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC")
_ARGS = ([ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int], None)
_LIB = build.Library(SOURCE, CFLAGS, {"rvqspec_snake_f32": _ARGS, "rvqspec_snake_bf16": _ARGS})


def snake(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """SnakeBeta ``x + inv_beta * sin(alpha * x)^2`` per channel.

    Args:
        x: ``(B, C, 1, T)`` channels-last (or any tensor whose memory is ``(rows, C)`` with channels contiguous),
            float32 or bfloat16, on the CPU.
        alpha: ``(C,)`` float32, the official ``exp(alpha)``. inv_beta: ``(C,)`` float32, the official
            ``1 / (exp(beta) + 1e-9)``.
    Returns:
        A new tensor like ``x`` (same shape, dtype and memory format). Through the kernel where it applies
        (channels-last-contiguous float32/bfloat16 CPU input, kernel available), else through torch operations;
        either way equal to the official ``SnakeBeta`` up to float rounding.
    """
    c = x.shape[1]
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16) or x.dim() != 4
            or not x.is_contiguous(memory_format=torch.channels_last)
            or _LIB.load_or_note("the SnakeBeta kernel of the streaming codec decoder",
                                 "torch operations compute it instead (five passes over memory)") is None):
        a = alpha.to(x.dtype).view(1, c, *([1] * (x.dim() - 2)))
        b = inv_beta.to(x.dtype).view(1, c, *([1] * (x.dim() - 2)))
        s = torch.sin(x * a)
        return torch.addcmul(x, b, s * s)
    y = torch.empty_like(x, memory_format=torch.channels_last)
    fn = _LIB.lib.rvqspec_snake_f32 if x.dtype == torch.float32 else _LIB.lib.rvqspec_snake_bf16
    fn(x.data_ptr(), y.data_ptr(), alpha.data_ptr(), inv_beta.data_ptr(), x.numel() // c, c)
    return y
