"""The weight-streaming floor of one code-predictor call (and of one talker step): the bytes of weights it reads
over the running machine's read bandwidth (docs/precision.md#the-floor; the bandwidth:
:func:`rvqspec_lib.eval.timing.read_bandwidth`)."""

from __future__ import annotations

from rvqspec_lib.decoding import predictor as P


def _tensors(module) -> list:
    """Parameters and persistent buffers of ``module`` (non-persistent ones such as rotary ``inv_freq`` are derived)."""
    out = [p for p in module.parameters()]
    for mod in module.modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        out += [b for name, b in mod.named_buffers(recurse=False) if name not in skip and b is not None]
    return out


def _count(parts: dict, rows: tuple = ()) -> dict:
    """``{"bytes", "elements", "by_dtype", "parts"}`` of ``{part: module}`` (every tensor of it) and of ``rows``:
    ``(part, table, n)``, ``n`` rows of an embedding ``table`` looked up."""
    by_dtype: dict[str, int] = {}
    sizes, elements = {}, 0
    for name, what in [*((k, [(t, t.numel()) for t in _tensors(m)]) for k, m in parts.items()),
                       *((k, [(t, n * t.shape[-1])]) for k, t, n in rows)]:
        sizes[name] = 0
        for t, n in what:
            key = str(t.dtype).replace("torch.", "")
            by_dtype[key] = by_dtype.get(key, 0) + n * t.element_size()
            sizes[name] += n * t.element_size()
            elements += n
    return {"bytes": sum(sizes.values()), "elements": int(elements), "by_dtype": by_dtype, "parts": sizes}


def call_weight_bytes(code_predictor, *, n_queries: int = 1) -> dict:
    """Bytes of weights one code-predictor call with ``n_queries`` query positions reads, at their stored size: the
    layers, the final norm, the projection, ONE head and the embedding rows looked up. Any precision; the ``meta``
    device works.

    Returns:
        ``{"bytes", "elements" (int8 scales included), "by_dtype": {dtype: bytes}, "parts": {"layers", "norm",
        "projection", "head", "embedding_rows"}}``.

    Raises:
        ValueError: ``n_queries < 1``.
    """
    if n_queries < 1:
        raise ValueError(f"n_queries must be >= 1, got {n_queries}")
    m = code_predictor.model
    return _count({"layers": m.layers, "norm": m.norm, "projection": code_predictor.small_to_mtp_projection,
                   "head": code_predictor.lm_head[0]},
                  rows=(("embedding_rows", m.codec_embedding[0].weight, n_queries),))


def talker_step_bytes(talker, *, context: int = 0, kv_element_bytes: int | None = None) -> dict:
    """Bytes one talker step reads: its weights (as :func:`call_weight_bytes` counts them) and the KV cache of
    ``context`` positions (``2 x layers x kv_heads x head_dim x context`` elements of ``kv_element_bytes``, default
    the activation dtype's).

    Returns:
        ``{"bytes": weight bytes, "elements", "by_dtype", "parts": {"layers", "norm", "codec_head"}, "kv_bytes",
        "context"}``.

    Raises:
        ValueError: ``context < 0``.
    """
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    m, cfg = talker.model, talker.model.config
    elem = int(m.norm.weight.element_size()) if kv_element_bytes is None else int(kv_element_bytes)
    kv = 2 * len(m.layers) * int(cfg.num_key_value_heads) * P.head_dim(cfg) * int(context) * elem
    return {**_count({"layers": m.layers, "norm": m.norm, "codec_head": talker.codec_head}), "kv_bytes": kv,
            "context": int(context)}


def floor_ms(n_bytes: int, gb_per_s: float) -> float:
    """The floor of a call: ``n_bytes`` read at ``gb_per_s`` (1e9 bytes a second), in milliseconds.

    Raises:
        ValueError: ``gb_per_s <= 0`` or ``n_bytes < 0``.
    """
    if gb_per_s <= 0 or n_bytes < 0:
        raise ValueError(f"need gb_per_s > 0 and n_bytes >= 0, got {gb_per_s} and {n_bytes}")
    return n_bytes / (gb_per_s * 1e9) * 1e3
