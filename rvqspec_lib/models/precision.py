"""Precision as the user's choice: the code predictor in float32, bfloat16 or int8 weights, checked against the CPU.

Precisions (docs/precision.md):

* ``float32``: the official module as loaded (every CPU runs it natively).
* ``bfloat16``: weights and activations in bfloat16 (``module.to(torch.bfloat16)``); needs AVX512-BF16 or AMX-BF16
  on a CPU to run natively.
* ``int8``: weight-only int8. Every ``nn.Linear`` of the code predictor (the decoder layers' projections, the
  per-depth heads, ``small_to_mtp_projection``) becomes an :class:`Int8Linear`: int8 weights with one float scale per
  output channel (symmetric, ``scale = max|w_row| / 127``); the rest of the module (embeddings, RMSNorms) and every
  activation is bfloat16. The matmul is torch's own weight-only int8 kernel ``torch._weight_int8pack_mm`` (the
  kernel torchao's and gpt-fast's int8 weight-only modes run on CPUs), which converts the int8 weights in registers
  and multiplies in floating point. Its float32-activation path is a scalar loop about 10x slower than its bfloat16
  path on this project's machines, hence bfloat16 activations; int8 therefore needs what bfloat16 needs
  (AVX512-BF16 or AMX-BF16).
* ``int8-dynamic``: the same int8 weights, and each activation ROW quantised to int8 on the fly with its own scale
  (``max|x_row| / 127``); the product is an exact int8 x int8 -> int32 matmul (``torch._int_mm``, oneDNN's VNNI /
  AMX-INT8 path), rescaled by the row's and the channel's scales. The rest of the module is float32. Needs int8
  dot products (AVX512-VNNI, AVX-VNNI or AMX-INT8).

Why not torch's stock dynamic quantisation (``torch.ao.quantization.quantize_dynamic``): it quantises activations
with one scale per TENSOR, i.e. over all rows of a verify call at once, so a row's result would depend on the other
nodes of the tree and a verify call would no longer compute what the AR call computes. In both schemes here each
output row of an int8 layer is a function of its own input row alone (the int32 accumulation of ``int8-dynamic`` is
exact, so not even the summation order depends on the row count): speculation stays lossless with respect to AR in
that precision.

Capability comes from the CPU flags in ``/proc/cpuinfo`` (:func:`rvqspec_lib.common.machine.cpu_flags`, read here as
``cpu_flags``); :func:`native_precisions` says which
precisions the CPU runs natively, :func:`check_precision` raises the one-line error a command prints, and
:func:`apply_precision` converts ``model.talker.code_predictor`` (the official module) in place and returns it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rvqspec_lib.common.machine import cpu_flags

#: The precisions a user can choose (``--dtype``), in the order tables show them.
PRECISIONS = ("float32", "bfloat16", "int8", "int8-dynamic")
#: CPU flags (as /proc/cpuinfo spells them) that give native bfloat16 arithmetic.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
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
    """The flags that matter for the precisions, present or not.

    Args:
        flags: CPU flags (default :func:`cpu_flags` of this machine).

    Returns:
        ``{"bf16": [...], "int8_dot": [...], "avx512f": bool, "avx2": bool}``: the present flags of
        :data:`BF16_FLAGS` and :data:`INT8_DOT_FLAGS`, and whether AVX512F / AVX2 are present.
    """
    flags = cpu_flags() if flags is None else frozenset(flags)
    return {"bf16": [f for f in BF16_FLAGS if f in flags], "int8_dot": [f for f in INT8_DOT_FLAGS if f in flags],
            "avx512f": "avx512f" in flags, "avx2": "avx2" in flags}


def native_precisions(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """Which of :data:`PRECISIONS` this CPU runs natively: float32 always, bfloat16 and int8 where a flag of
    :data:`BF16_FLAGS` is present (module docstring: why int8 needs it), int8-dynamic where one of
    :data:`INT8_DOT_FLAGS` is.

    Args:
        flags: CPU flags (default :func:`cpu_flags` of this machine).
    """
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
    """A linear layer with int8 weights and one scale per output channel (the ``int8`` and ``int8-dynamic``
    precisions of the module docstring).

    ``dynamic=False`` (``int8``): ``y = x_bf16 @ (w_int8 * scale[:, None]).T + bias`` through
    ``torch._weight_int8pack_mm`` where the input width is a multiple of :data:`INT8PACK_K_MULTIPLE`, else through
    ``F.linear`` on the dequantised weight; bfloat16 in and out.
    ``dynamic=True`` (``int8-dynamic``): each input row x is quantised to ``round(x / s_x)`` with
    ``s_x = max|x| / 127``, multiplied exactly in int32 (``torch._int_mm``), and rescaled:
    ``y = (x_int8 @ w_int8.T) * s_x * scale + bias``; float32 out. Either way each output row depends on its input
    row alone.

    Args:
        linear: the ``nn.Linear`` to quantise (any float dtype); its weight is rounded to
            ``round(w / scale)`` clamped to [-127, 127] with ``scale = max|w_row| / 127`` (1 for an all-zero row).
        dynamic: see above.

    Attributes: ``weight_int8`` ``(out, in)`` int8 buffer, ``scale`` ``(out,)`` buffer (bfloat16, or float32 when
    ``dynamic``), ``bias`` ``(out,)`` parameter of the same dtype or None, ``in_features``, ``out_features``; when
    ``dynamic``, ``weight_int8_kn``, the same weights ``(in, out)`` for calls of several rows (non-persistent; a
    call reads one of the two copies).
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
        """The dequantised weight ``(out, in)`` in the layer's activation dtype (for code that reads ``.weight``;
        not the fast path)."""
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


def _quantise_linears(module: nn.Module, *, dynamic: bool) -> int:
    n = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child, dynamic=dynamic))
            n += 1
        else:
            n += _quantise_linears(child, dynamic=dynamic)
    return n


def apply_precision(code_predictor: nn.Module, precision: str, *, require_native: bool = True,
                    flags: frozenset[str] | None = None) -> nn.Module:
    """Convert the code predictor (``model.talker.code_predictor``, the official module) to a precision, IN PLACE.

    Args:
        code_predictor: the official module, in any float dtype.
        precision: one of :data:`PRECISIONS`.
        require_native: check with :func:`check_precision` that the CPU runs it natively (``False``: convert
            anyway, e.g. for correctness tests on any CPU; it then runs emulated, slowly).
        flags: CPU flags for that check (default this machine's).

    Returns:
        the same module, converted: float32 / bfloat16 through ``.to(dtype)``; int8 (in bfloat16) and int8-dynamic
        (in float32) with every ``nn.Linear`` replaced by an :class:`Int8Linear` (module docstring).

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
