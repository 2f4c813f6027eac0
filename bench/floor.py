"""The floor of every timed part: the bytes of weights a code-predictor call or a talker step reads over the running
machine's read bandwidth (docs/precision.md#the-floor; the bandwidth: :func:`rvqspec_lib.eval.timing.read_bandwidth`),
and the codec decoder's matmul FLOPs over the core's peak on its own shapes (:func:`codec_floor_ms`; the codec is
bound by arithmetic, docs/codec_streaming.md#speed-against-the-floor)."""

from __future__ import annotations

import torch
from torch import nn

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.eval.timing import interleaved


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


def call_weight_bytes(code_predictor) -> dict:
    """Bytes of weights one code-predictor call of one query position reads (the floor's call, t(1)), at their stored
    size: the layers, the final norm, the projection, ONE head and the embedding row looked up. Any precision; the
    ``meta`` device works.

    Returns:
        ``{"bytes", "elements" (int8 scales included), "by_dtype": {dtype: bytes}, "parts": {"layers", "norm",
        "projection", "head", "embedding_rows"}}``.
    """
    m = code_predictor.model
    return _count({"layers": m.layers, "norm": m.norm, "projection": code_predictor.small_to_mtp_projection,
                   "head": code_predictor.lm_head[0]}, rows=(("embedding_rows", m.codec_embedding[0].weight, 1),))


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


def stage_layers(decoder) -> dict[str, list[tuple[str, nn.Module, int]]]:
    """``{stage: [(name, module, samples_per_frame)]}``: the matmul layers (conv, transposed conv, linear) of each
    stage; a layer's multiply-adds per sample are its weight's element count."""
    d = decoder
    out: dict[str, list] = {"rvq+pre_conv": [("rvq out", d.quantizer.rvq_first.output_proj, 1),
                                             ("rvq out", d.quantizer.rvq_rest.output_proj, 1),
                                             ("pre_conv", d.pre_conv.conv, 1)]}
    out["transformer"] = [(n, m, 1) for n, m in d.pre_transformer.named_modules() if isinstance(m, nn.Linear)]
    spf, up = 1, []
    for i, (tc, cnx) in enumerate(d.upsample):
        up.append((f"up{i}.tconv", tc.conv, spf))
        spf *= int(tc.conv.stride[0])
        up += [(f"up{i}.{n}", m, spf) for n, m in cnx.named_modules() if isinstance(m, (nn.Conv1d, nn.Linear))]
    out["upsample"] = up
    out["conv_in"] = [("conv_in", d.decoder[0].conv, spf)]
    for i, blk in enumerate(d.decoder[1:-2]):
        tc = blk.block[1].conv
        layers = [(f"block{i}.tconv", tc, spf)]
        spf *= int(tc.stride[0])
        layers += [(f"block{i}.{n}", m, spf) for n, m in blk.named_modules() if isinstance(m, nn.Conv1d)]
        out[f"block{i}"] = layers
    out["conv_out"] = [("conv_out", d.decoder[-1].conv, spf)]
    return out


def matmul_flops_per_frame(decoder) -> float:
    """FLOPs of one frame through the decoder's matmul layers (``2 x weight elements x samples`` each), from the
    shapes alone (attention and elementwise layers, about one percent, left out)."""
    return float(sum(2 * m.weight.numel() * spf for layers in stage_layers(decoder).values() for _, m, spf in layers))


def _shapes(decoder) -> list[tuple]:
    """Distinct (kind, c_in, c_out, kernel, dilation, groups, stride, samples per frame) of the matmul layers."""
    out = []
    for layers in stage_layers(decoder).values():
        for _, m, spf in layers:
            if isinstance(m, nn.Linear):
                out.append(("linear", m.in_features, m.out_features, 1, 1, 1, 1, spf))
            else:
                out.append(("tconv" if isinstance(m, nn.ConvTranspose1d) else "conv", m.in_channels, m.out_channels,
                            m.kernel_size[0], m.dilation[0], m.groups, m.stride[0], spf))
    return list(dict.fromkeys(out))


def peak_gflops(decoder, *, frames: int = 8, repeats: int = 7) -> dict:
    """The core's compute rate on the decoder's own shapes: each distinct shape (a chunk of ``frames`` frames) run by
    oneDNN from a prepacked weight in the decoder's dtype, hot in cache, best of ``repeats``.

    Returns:
        ``{"peak_gflops": the best rate, "shapes": [{"shape", "gflops"}, ...], "dtype", "threads"}``.
    """
    mk = torch.ops.mkldnn
    dt = next(decoder.parameters()).dtype
    gen = torch.Generator().manual_seed(0)
    rows = []
    for kind, ci, co, k, dil, g, s, spf in _shapes(decoder):
        t = spf * frames
        if kind == "linear":
            w = (torch.randn(co, ci, generator=gen) * 0.02).to(dt)
            x = torch.randn(t, ci, generator=gen).to(dt)
            pk = mk._reorder_linear_weight(w, t)
            fn = lambda x=x, pk=pk: mk._linear_pointwise(x, pk, None, "none", [], "")  # noqa: E731
            flops = 2 * ci * co * t
        elif kind == "conv":
            w = (torch.randn(co, ci // g, 1, k, generator=gen) * 0.02).to(dt)
            w = w.contiguous(memory_format=torch.channels_last)
            span = t + (k - 1) * dil
            x = torch.randn(1, ci, 1, span, generator=gen).to(dt).contiguous(memory_format=torch.channels_last)
            pk = mk._reorder_convolution_weight(w, [0, 0], [1, 1], [1, dil], g, [1, ci, 1, span])
            fn = lambda x=x, pk=pk, dil=dil, g=g: mk._convolution_pointwise(  # noqa: E731
                x, pk, None, [0, 0], [1, 1], [1, dil], g, "none", [], "")
            flops = 2 * (ci // g) * co * k * t
        else:
            w = (torch.randn(ci, co, 1, k, generator=gen) * 0.02).to(dt).contiguous(memory_format=torch.channels_last)
            x = torch.randn(1, ci, 1, t, generator=gen).to(dt).contiguous(memory_format=torch.channels_last)
            pk = mk._reorder_convolution_transpose_weight(w, [0, 0], [0, 0], [1, s], [1, 1], 1, [1, ci, 1, t])
            fn = lambda x=x, pk=pk, s=s: mk._convolution_transpose_pointwise(  # noqa: E731
                x, pk, None, [0, 0], [0, 0], [1, s], [1, 1], 1, "none", [], "")
            flops = 2 * ci * co * k * t
        best = min(interleaved({"op": lambda _i, fn=fn: fn()}, repeats=repeats, warmup=1).ms["op"]) / 1e3
        rows.append({"shape": f"{kind} {ci}->{co} k{k} d{dil} g{g} s{s} x{t}", "gflops": flops / best / 1e9})
    return {"peak_gflops": max(r["gflops"] for r in rows), "shapes": rows, "dtype": str(dt).replace("torch.", ""),
            "threads": torch.get_num_threads()}


def codec_floor_ms(decoder, gflops: float) -> float:
    """The codec decoder's floor per frame in ms: :func:`matmul_flops_per_frame` at ``gflops`` (:func:`peak_gflops`).

    Raises:
        ValueError: ``gflops <= 0``.
    """
    if gflops <= 0:
        raise ValueError(f"need gflops > 0, got {gflops}")
    return matmul_flops_per_frame(decoder) / (gflops * 1e9) * 1e3
