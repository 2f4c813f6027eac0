"""Precision as the user's choice: the code predictor in float32, bfloat16, weight-only int8 or int8 with per-row
dynamic activations, checked against the CPU's flags (docs/precision.md#the-precisions, and why each int8 row depends
on its own input row alone: docs/precision.md#the-two-int8-schemes-and-why). :func:`apply_precision` converts
``model.talker.code_predictor`` in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rvqspec_lib.common.machine import BF16_FLAGS, cpu_flags

#: The precisions a user can choose (``--dtype``), in the order tables show them.
PRECISIONS = ("float32", "bfloat16", "int8", "int8-dynamic")
#: CPU flags that give int8 dot products (``int8-dynamic`` needs one; the weight-only kernel of ``int8`` does not).
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
#: The float dtype each precision's activations (and non-linear weights) are held in.
ACTIVATION_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.bfloat16,
                    "int8-dynamic": torch.float32}
#: ``torch._weight_int8pack_mm`` needs the input width to be a multiple of this (measured on torch 2.13.0: other
#: widths give wrong results or crash); other layers use the dequantised weight through ``F.linear``.
INT8PACK_K_MULTIPLE = 16

_NEEDS = {"bfloat16": "AVX512-BF16 or AMX-BF16",
          "int8": "AVX512-BF16 or AMX-BF16 (its activations are bfloat16; its weights are read as int8)",
          "int8-dynamic": "AVX512-VNNI, AVX-VNNI or AMX-INT8 (int8 x int8 dot products)"}


def cpu_features(flags: frozenset[str] | None = None) -> dict:
    """The flags that matter for the precisions (``flags``: default this machine's): ``{"bf16": [...], "int8_dot":
    [...], "avx512f": bool, "avx2": bool}``, the present flags of :data:`BF16_FLAGS` and :data:`INT8_DOT_FLAGS`."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    return {"bf16": [f for f in BF16_FLAGS if f in flags], "int8_dot": [f for f in INT8_DOT_FLAGS if f in flags],
            "avx512f": "avx512f" in flags, "avx2": "avx2" in flags}


def native_precisions(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """Which of :data:`PRECISIONS` the CPU of ``flags`` (default this machine's) runs natively."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    bf16 = any(f in flags for f in BF16_FLAGS)
    dot = any(f in flags for f in INT8_DOT_FLAGS)
    ok = {"float32": True, "bfloat16": bf16, "int8": bf16, "int8-dynamic": dot}
    return tuple(p for p in PRECISIONS if ok[p])


def check_precision(precision: str, *, device: str = "cpu", flags: frozenset[str] | None = None) -> str:
    """Check a precision name and, on a CPU, that the CPU runs it natively. Returns the name.

    Raises:
        ValueError: (one line naming the fix) an unknown precision, or one this CPU cannot run natively, e.g.
            ``--dtype bfloat16 needs AVX512-BF16 or AMX-BF16; this CPU has avx2, avx512f: use float32``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if not str(device).startswith("cpu"):
        return precision
    flags = cpu_flags() if flags is None else frozenset(flags)
    if precision not in native_precisions(flags):
        have = [f for f in ("avx2", "avx512f", *BF16_FLAGS, *INT8_DOT_FLAGS) if f in flags]
        alt = [p for p in native_precisions(flags) if p != "float32"]
        raise ValueError(f"--dtype {precision} needs {_NEEDS[precision]}; this CPU has "
                         f"{', '.join(have) or 'none of those flags'}: use float32{''.join(' or ' + a for a in alt)}")
    return precision


class Int8Linear(nn.Module):
    """``linear`` with int8 weights ``weight_int8`` ``(out, in)`` and one ``scale`` per output channel (bfloat16,
    float32 when ``dynamic``; docs/precision.md#the-two-int8-schemes-and-why): ``dynamic=False`` (``int8``) bfloat16
    in and out; ``dynamic=True`` (``int8-dynamic``) each row quantised with its own scale, multiplied exactly in
    int32, float32 out.
    """

    def __init__(self, linear: nn.Linear, *, dynamic: bool = False):
        super().__init__()
        w = linear.weight.detach().to(torch.float32)
        amax = w.abs().amax(1)
        scale = (amax / 127.0).where(amax > 0, torch.ones(()))
        dtype = torch.float32 if dynamic else torch.bfloat16
        self.dynamic = bool(dynamic)
        self.in_features, self.out_features = int(w.shape[1]), int(w.shape[0])
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
        self.packed = self.in_features % INT8PACK_K_MULTIPLE == 0
        if self.dynamic:  # a (in, out) copy for calls of several rows (non-persistent: not saved, not a weight read)
            self.register_buffer("weight_int8_kn", self.weight_int8.t().contiguous(), persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight ``(out, in)`` in the activation dtype (not the fast path)."""
        w = self.weight_int8.to(torch.float32) * self.scale.to(torch.float32)[:, None]
        return w if self.dynamic else w.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(..., in)`` any float dtype -> ``(..., out)`` bfloat16 (``int8``) or float32 (``int8-dynamic``)."""
        lead = x.shape[:-1]
        if self.dynamic:
            x2 = x.reshape(-1, self.in_features).to(torch.float32)
            s_x = x2.abs().amax(1, keepdim=True).clamp_min(1e-30) / 127.0  # (M, 1): one scale per row
            x_q = torch.round(x2 / s_x).clamp(-127, 127).to(torch.int8)
            # oneDNN is fastest on the (out, in) layout for one row and on (in, out) for several (measured on this
            # project's machines); the int32 products are exact, so the choice cannot change a row's result
            w = self.weight_int8.t() if x_q.shape[0] == 1 else self.weight_int8_kn
            y = torch._int_mm(x_q, w).to(torch.float32) * s_x * self.scale
        else:
            x = x.to(torch.bfloat16)
            if not self.packed:
                return F.linear(x, self.weight, self.bias)
            y = torch._weight_int8pack_mm(x.reshape(-1, self.in_features), self.weight_int8, self.scale)
        y = y.reshape(*lead, self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        act = "int8 per-row activations" if self.dynamic else "bfloat16 activations"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights, {act}"


def _quantise_linears(module: nn.Module, *, dynamic: bool) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child, dynamic=dynamic))
        else:
            _quantise_linears(child, dynamic=dynamic)


def apply_precision(code_predictor: nn.Module, precision: str, *, require_native: bool = True,
                    flags: frozenset[str] | None = None) -> nn.Module:
    """Convert the official code predictor to one of :data:`PRECISIONS` IN PLACE (``.to(dtype)``; for int8 every
    ``nn.Linear`` an :class:`Int8Linear`) and return it; ``require_native``: first :func:`check_precision` with
    ``flags`` (``False``: convert anyway; it then runs emulated, slowly).

    Raises:
        ValueError: an unknown precision, or (``require_native``) one the CPU cannot run natively (one line).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if require_native:
        device = str(next(code_predictor.parameters()).device)
        check_precision(precision, device=device, flags=flags)
    code_predictor.to(ACTIVATION_DTYPE[precision])
    if precision in ("int8", "int8-dynamic"):
        _quantise_linears(code_predictor, dynamic=precision == "int8-dynamic")
    return code_predictor


def precision_of(code_predictor: nn.Module) -> str:
    """The precision name of a code predictor: ``"int8"`` / ``"int8-dynamic"`` if it holds an :class:`Int8Linear`,
    else its parameters' dtype name (``"float32"``, ``"bfloat16"``, ``"float64"``, ...)."""
    for m in code_predictor.modules():
        if isinstance(m, Int8Linear):
            return "int8-dynamic" if m.dynamic else "int8"
    return str(next(code_predictor.parameters()).dtype).replace("torch.", "")
