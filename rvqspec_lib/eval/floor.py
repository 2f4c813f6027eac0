"""The weight-streaming floor of one code-predictor call, measured on the running machine (docs/precision.md#the-floor).

A code-predictor call with a few query positions does little arithmetic per weight: on a CPU it is bound by reading
its weights from memory once. Its floor is therefore

    floor = (bytes of weights one call reads) / (read bandwidth of the running machine),

and every measured call time is reported as a multiple of it (``t(1) / floor``; 1.0 would be a call that does
nothing but stream its weights once).

* Bytes (:func:`call_weight_bytes`): the tensors one call actually touches, at the size they are stored in (float32
  4 bytes, bfloat16 2, int8 1 plus its per-channel scales): every parameter and weight buffer of the decoder layers
  (attention and MLP projections, their norms), the final norm, ``small_to_mtp_projection`` where it is a linear
  layer, ONE per-depth head (``lm_head[j]``; an AR call applies one), and of the per-depth embedding table only the
  rows looked up (one per query position). Rotary tables (``inv_freq``) are computed, not weights, and are left out.
* Bandwidth: the machine's streaming read bandwidth, :func:`rvqspec_lib.eval.timing.read_bandwidth` (read before and
  after a timing, the faster kept: :func:`rvqspec_lib.eval.timing.bandwidth_around`).
"""

from __future__ import annotations


def _tensors(module) -> list:
    """Parameters and persistent buffers of ``module`` (non-persistent buffers such as rotary ``inv_freq`` are
    derived tables, not weights)."""
    out = [p for p in module.parameters()]
    for mod in module.modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        out += [b for name, b in mod.named_buffers(recurse=False) if name not in skip and b is not None]
    return out


def _add(by_dtype: dict, tensors, rows_of=None) -> int:
    total = 0
    for t in tensors:
        n = t.numel() if rows_of is None else rows_of * t.shape[-1]
        b = n * t.element_size()
        key = str(t.dtype).replace("torch.", "")
        by_dtype[key] = by_dtype.get(key, 0) + b
        total += b
    return total


def call_weight_bytes(code_predictor, *, n_queries: int = 1) -> dict:
    """Bytes of weights one code-predictor call with ``n_queries`` query positions reads (module docstring).

    Args:
        code_predictor: ``model.talker.code_predictor`` (the official module) in any precision
            (:func:`rvqspec_lib.models.precision.apply_precision`).
        n_queries: query positions of the call (embedding rows looked up); >= 1.

    Returns:
        ``{"bytes": total, "elements": tensor elements read (int8 scales included), "by_dtype": {dtype: bytes},
        "parts": {"layers", "norm", "projection", "head", "embedding_rows"}: bytes}``. Works on the ``meta``
        device too (no weights needed to count them).

    Raises:
        ValueError: ``n_queries < 1``.
    """
    if n_queries < 1:
        raise ValueError(f"n_queries must be >= 1, got {n_queries}")
    m = code_predictor.model
    by_dtype: dict[str, int] = {}
    parts = {
        "layers": _add(by_dtype, _tensors(m.layers)),
        "norm": _add(by_dtype, _tensors(m.norm)),
        "projection": _add(by_dtype, _tensors(code_predictor.small_to_mtp_projection)),
        "head": _add(by_dtype, _tensors(code_predictor.lm_head[0])),
        "embedding_rows": _add(by_dtype, [m.codec_embedding[0].weight], rows_of=n_queries),
    }
    touched = (_tensors(m.layers) + _tensors(m.norm) + _tensors(code_predictor.small_to_mtp_projection)
               + _tensors(code_predictor.lm_head[0]))
    elements = sum(t.numel() for t in touched) + n_queries * int(m.codec_embedding[0].weight.shape[-1])
    return {"bytes": sum(parts.values()), "elements": int(elements), "by_dtype": by_dtype, "parts": parts}


def floor_ms(n_bytes: int, gb_per_s: float) -> float:
    """The floor of a call: ``n_bytes`` read at ``gb_per_s`` (1e9 bytes a second), in milliseconds.

    Raises:
        ValueError: ``gb_per_s <= 0`` or ``n_bytes < 0``.
    """
    if gb_per_s <= 0 or n_bytes < 0:
        raise ValueError(f"need gb_per_s > 0 and n_bytes >= 0, got {gb_per_s} and {n_bytes}")
    return n_bytes / (gb_per_s * 1e9) * 1e3
