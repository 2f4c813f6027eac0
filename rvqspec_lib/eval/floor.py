"""The weight-streaming floor of one code-predictor call (and of one talker step, :func:`talker_step_bytes`), measured
on the running machine (docs/precision.md#the-floor).

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


def talker_step_bytes(talker, *, context: int = 0, kv_element_bytes: int | None = None) -> dict:
    """Bytes one talker step (one new position, then ``codec_head``) reads: the weights, and the KV cache it attends.

    Weights as :func:`call_weight_bytes` counts them (stored size, int8 scales included; rotary tables left out):
    every parameter and persistent buffer of the decoder layers, the final norm and ``codec_head``. The step's input
    embedding is given (the frame loop sums table rows the caller looked up), so no table is counted. The KV cache:
    ``context`` positions of keys and values in every layer, ``2 x layers x kv_heads x head_dim x context`` elements.

    Args:
        talker: the official talker (``lm.model.talker``) in any precision; the ``meta`` device works.
        context: positions already cached (>= 0).
        kv_element_bytes: bytes per cached element (default: the activation dtype's, read from the final norm's
            weight: 4 in float32 and int8-dynamic, 2 in bfloat16 and int8, as the official cache holds them; the
            native talker's cache is float32, 4).

    Returns:
        ``{"bytes": weight bytes, "elements", "by_dtype", "parts": {"layers", "norm", "codec_head"}, "kv_bytes",
        "context"}``.

    Raises:
        ValueError: ``context < 0``.
    """
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    m = talker.model
    by_dtype: dict[str, int] = {}
    parts = {"layers": _add(by_dtype, _tensors(m.layers)), "norm": _add(by_dtype, _tensors(m.norm)),
             "codec_head": _add(by_dtype, _tensors(talker.codec_head))}
    touched = _tensors(m.layers) + _tensors(m.norm) + _tensors(talker.codec_head)
    cfg = m.config
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    elem = int(m.norm.weight.element_size()) if kv_element_bytes is None else int(kv_element_bytes)
    kv = 2 * len(m.layers) * int(cfg.num_key_value_heads) * head_dim * int(context) * elem
    return {"bytes": sum(parts.values()), "elements": int(sum(t.numel() for t in touched)), "by_dtype": by_dtype,
            "parts": parts, "kv_bytes": kv, "context": int(context)}


def floor_ms(n_bytes: int, gb_per_s: float) -> float:
    """The floor of a call: ``n_bytes`` read at ``gb_per_s`` (1e9 bytes a second), in milliseconds.

    Raises:
        ValueError: ``gb_per_s <= 0`` or ``n_bytes < 0``.
    """
    if gb_per_s <= 0 or n_bytes < 0:
        raise ValueError(f"need gb_per_s > 0 and n_bytes >= 0, got {gb_per_s} and {n_bytes}")
    return n_bytes / (gb_per_s * 1e9) * 1e3
