"""Time the streaming codec decoder against the official ``chunked_decode`` and against its floors (arithmetic and
roofline), per precision and chunk size, each stage timed (docs/codec_streaming.md#speed-against-the-floor). Medians
of the thread's CPU time, wall clock beside it, the load watched; the real-size decoder has RANDOM weights:
timing only."""

from __future__ import annotations

import os
import statistics
import time

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from rvqspec_lib.common.machine import cpu_flags, cpu_model
from rvqspec_lib.eval.timing import cpu_oversubscribed, interleaved, read_bandwidth
from rvqspec_lib.models.configs import build_codec_decoder
from rvqspec_lib.device.precision import native_precisions
from rvqspec_lib.device.streaming_codec import StreamingCodecDecoder

#: Chunk sizes of the table (frames of 80 ms).
CHUNK_FRAMES = (1, 2, 4, 8)
#: The official ``chunked_decode``'s default left context (frames recomputed before every chunk).
LEFT_CONTEXT = 25
#: Frames pushed before timing: past the released transformer's attention window (72), so the KV cache is full.
WARMUP_FRAMES = 80
#: CPU flags printed beside the CPU's name.
SHOWN_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _codes(n_frames: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, 16, n_frames), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------------------ counts
def stage_flops(decoder, chunk_frames: int) -> dict[str, float]:
    """FLOPs per FRAME of each stage of :meth:`StreamingCodecDecoder.stages` for chunks of ``chunk_frames`` frames in
    steady state (``FlopCounterMode``)."""
    dec = StreamingCodecDecoder(decoder, backend="official")
    codes = _codes(WARMUP_FRAMES + chunk_frames)
    with torch.no_grad():
        dec.push(codes[..., :WARMUP_FRAMES])  # fill the window, in one chunk (the official backend is slow)
        out = {}
        h = codes[..., WARMUP_FRAMES:WARMUP_FRAMES + chunk_frames]
        for name, stage in dec.stages():
            with FlopCounterMode(display=False) as fc:
                h = stage(h)
            out[name] = fc.get_total_flops() / chunk_frames
    return out


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
    shapes alone; attention and elementwise layers (counted by :func:`stage_flops`) left out."""
    return float(sum(2 * m.weight.numel() * spf for layers in stage_layers(decoder).values() for _, m, spf in layers))


def stage_weight_bytes(decoder, chunk_frames: int = 1) -> dict[str, int]:
    """Bytes of weights each stage reads per chunk: matmul weights and biases, and the ``16 * chunk_frames`` codebook
    rows looked up."""
    out = {name: sum(sum(p.numel() * p.element_size() for p in m.parameters()) for _, m, _ in layers)
           for name, layers in stage_layers(decoder).items()}
    row = decoder.config.codebook_dim // 2
    out["rvq+pre_conv"] += 16 * chunk_frames * row * next(decoder.parameters()).element_size()
    return out


def stage_roofline_ms(decoder, chunk_frames: int, peak_gflops: float, gb_per_s: float) -> dict[str, float]:
    """The roofline floor of each stage in ms per FRAME: per matmul layer ``max(FLOPs / peak, weight bytes /
    bandwidth)`` for one chunk, over its frames."""
    out = {}
    for name, layers in stage_layers(decoder).items():
        t = 0.0
        for _, m, spf in layers:
            flops = 2 * m.weight.numel() * spf * chunk_frames
            nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
            t += max(flops / (peak_gflops * 1e9), nbytes / (gb_per_s * 1e9))
        out[name] = t * 1e3 / chunk_frames
    return out


# ------------------------------------------------------------------------------------------------------------- peak
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


# ------------------------------------------------------------------------------------------------------------ times
def time_streaming(decoder, chunk_frames: int, *, backend: str = "onednn", repeats: int = 12) -> dict:
    """Per-stage time of :class:`StreamingCodecDecoder` on chunks of ``chunk_frames`` frames in steady state, in
    thread CPU time (what other processes do not inflate) and wall clock.

    Returns:
        ``{"ms_per_frame", "min_ms_per_frame", "wall_ms_per_frame", "stages_ms_per_frame": {stage: ms},
        "other_cpu_frac"}``: medians over the timed chunks of thread CPU time per frame (and its minimum), of wall
        time per frame, and of each stage's thread CPU time per frame.
    """
    dec = StreamingCodecDecoder(decoder, backend=backend, chunk_frames_hint=chunk_frames)
    codes = _codes(WARMUP_FRAMES + chunk_frames * repeats, seed=1)
    stages = dec.stages()
    pushed = [WARMUP_FRAMES]  # the stream's position: each run pushes the next chunk (the decoder keeps state)

    def push(_i):
        i = pushed[0]
        h, per_stage = codes[..., i:i + chunk_frames], {}
        for name, stage in stages:
            t0 = time.thread_time()
            h = stage(h)
            per_stage[name] = (time.thread_time() - t0) * 1e3 / chunk_frames
        pushed[0] += chunk_frames
        return per_stage

    with torch.no_grad():
        for i in range(0, WARMUP_FRAMES, chunk_frames):
            dec.push(codes[..., i:i + chunk_frames])
        t = interleaved({"push": push}, repeats=repeats, warmup=0, desc="streaming codec")
    cpu = [x / chunk_frames for x in t.cpu_ms["push"]]
    return {"ms_per_frame": statistics.median(cpu), "min_ms_per_frame": min(cpu),
            "wall_ms_per_frame": statistics.median(t.ms["push"]) / chunk_frames,
            "stages_ms_per_frame": {name: statistics.median(r[name] for r in t.out["push"]) for name, _ in stages},
            "other_cpu_frac": t.meta.get("other_cpu_frac")}


def time_chunked_decode(decoder, chunk_frames: int, *, left_context: int = LEFT_CONTEXT, repeats: int = 3) -> dict:
    """The official ``chunked_decode`` in steady state: one ``forward`` over ``left_context + chunk_frames`` frames
    per chunk, per frame.

    Returns:
        ``{"ms_per_frame": median thread CPU time, "wall_ms_per_frame", "other_cpu_frac"}``.
    """
    codes = _codes(left_context + chunk_frames, seed=2)
    with torch.no_grad():
        t = interleaved({"chunk": lambda _i: decoder(codes)}, repeats=repeats, warmup=1, desc="chunked_decode")
    return {"ms_per_frame": statistics.median(t.cpu_ms["chunk"]) / chunk_frames,
            "wall_ms_per_frame": statistics.median(t.ms["chunk"]) / chunk_frames,
            "other_cpu_frac": t.meta.get("other_cpu_frac")}


def fidelity(decoder, *, frames: int = 100, chunk_frames: int = 4, left_context: int = LEFT_CONTEXT,
             backend: str = "onednn") -> dict:
    """Relative RMS differences (``rms(a - b) / rms(b)``) of the stream and of ``chunked_decode`` from the full
    ``forward`` on one random stream.

    Returns:
        ``{"stream_vs_forward", "chunked_vs_forward_head" (the first left_context + 1 frames),
        "chunked_vs_forward_tail" (the rest, where 25 frames of context fall short of the 72-frame window), "frames",
        "chunk_frames"}``.
    """
    codes = _codes(frames, seed=3)
    dec = StreamingCodecDecoder(decoder, backend=backend)
    with torch.no_grad():
        ref = decoder(codes)[:, 0].float()
        cd = decoder.chunked_decode(codes, chunk_size=chunk_frames, left_context_size=left_context)[:, 0].float()
        wav = torch.cat([dec.push(codes[..., i:i + chunk_frames]) for i in range(0, frames, chunk_frames)], -1)

    def rel(a, b):
        return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())

    head = (left_context + 1) * decoder.total_upsample
    return {"stream_vs_forward": rel(wav, ref), "chunked_vs_forward_head": rel(cd[:, :head], ref[:, :head]),
            "chunked_vs_forward_tail": rel(cd[:, head:], ref[:, head:]), "frames": frames,
            "chunk_frames": chunk_frames}


def streaming_table(*, precisions: tuple[str, ...] | None = None, chunk_frames: tuple[int, ...] = CHUNK_FRAMES,
                    config: str = "released", threads: int = 1, repeats: int = 12, official_repeats: int = 3,
                    official: bool = True) -> dict:
    """The benchmark table: ms per frame of the streaming decoder vs ``chunked_decode`` vs the floors, per precision
    and chunk size, stage by stage.

    Args:
        precisions: default the CPU's native ones among float32 and bfloat16. chunk_frames: chunk sizes. config:
            ``"released"`` (real size, random weights) or ``"tiny"``. threads: torch threads (restored after).
            official: also time ``chunked_decode`` (slow).

    Returns:
        ``{"cpu", "threads", "bandwidth_gb_per_s", "config", "random_weights": True, "rows", "peaks", "stages"}``; a
        row: ``precision``, ``chunk_frames``, ``stream_ms``, ``stream_min_ms``, ``official_ms``, ``flops_per_frame``,
        ``arith_floor_ms``, ``roofline_floor_ms``, ``x_arith``, ``x_roofline``, ``other_cpu_frac``,
        ``oversubscribed``; ``stages[precision][chunk]``: per stage ms, FLOPs, bytes, floors.

    Raises:
        ValueError: a precision this CPU does not run natively, or an unknown one.
    """
    native = native_precisions()
    precisions = tuple(p for p in ("float32", "bfloat16") if p in native) if precisions is None else precisions
    for p in precisions:
        if p not in DTYPES or p not in native:
            raise ValueError(f"precision {p!r} is not one this CPU runs natively among float32, bfloat16 "
                             f"(native here: {', '.join(native)})")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        bw = read_bandwidth()["gb_per_s_max"]  # what the machine can stream: its best pass, not a contended median
        flags = cpu_flags()
        out = {"cpu": {"model": cpu_model(), "flags": {f: f in flags for f in SHOWN_FLAGS}, "cores": os.cpu_count()},
               "threads": threads, "bandwidth_gb_per_s": bw, "config": config,
               "random_weights": True, "rows": [], "peaks": {}, "stages": {}}
        flops_of: dict[int, dict] = {}  # FLOPs do not depend on the precision
        for prec in precisions:
            decoder = build_codec_decoder(config, dtype=DTYPES[prec])
            peak = peak_gflops(decoder)
            out["peaks"][prec] = peak
            out["stages"][prec] = {}
            for n in chunk_frames:
                if n not in flops_of:
                    flops_of[n] = stage_flops(decoder, n)
                flops = flops_of[n]
                wbytes = stage_weight_bytes(decoder, n)
                roofs = stage_roofline_ms(decoder, n, peak["peak_gflops"], bw)
                st = time_streaming(decoder, n, repeats=repeats)
                off = time_chunked_decode(decoder, n, repeats=official_repeats) if official else None
                gf = peak["peak_gflops"] * 1e9
                stages = {}
                for name in flops:
                    arith = flops[name] / gf * 1e3
                    stages[name] = {"ms": st["stages_ms_per_frame"][name], "flops": flops[name],
                                    "weight_bytes": wbytes[name], "arith_floor_ms": arith,
                                    "roofline_floor_ms": max(arith, roofs[name])}
                out["stages"][prec][n] = stages
                total_flops = sum(flops.values())
                arith = total_flops / gf * 1e3
                roof = sum(s["roofline_floor_ms"] for s in stages.values())
                row = {"precision": prec, "chunk_frames": n, "stream_ms": st["ms_per_frame"],
                       "stream_min_ms": st["min_ms_per_frame"], "stream_wall_ms": st["wall_ms_per_frame"],
                       "official_ms": off and off["ms_per_frame"],
                       "official_wall_ms": off and off["wall_ms_per_frame"],
                       "flops_per_frame": total_flops, "arith_floor_ms": arith, "roofline_floor_ms": roof,
                       "x_arith": st["ms_per_frame"] / arith, "x_roofline": st["ms_per_frame"] / roof,
                       "other_cpu_frac": st["other_cpu_frac"]}
                row["oversubscribed"] = cpu_oversubscribed({"other_cpu_frac": row["other_cpu_frac"],
                                                            "cpu_count": out["cpu"]["cores"], "threads": threads})
                out["rows"].append(row)
            del decoder
    finally:
        torch.set_num_threads(old_threads)
    return out


def format_streaming_table(result: dict) -> str:
    """:func:`streaming_table` as text: the CPU line, a row per precision x chunk size (ms per frame of thread CPU
    time, wall time beside it), then the per-stage breakdown."""
    cpu = result["cpu"]
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["flags"].items())
    lines = [f"CPU: {cpu['model']} ({cpu['cores']} cores; {flags})",
             f"torch threads {result['threads']}; read bandwidth {result['bandwidth_gb_per_s']:.1f} GB/s; config "
             f"{result['config']} with RANDOM weights (timing only)",
             "peak (best oneDNN rate on the decoder's own shapes): " + ", ".join(
                 f"{p} {v['peak_gflops']:.0f} GFLOP/s" for p, v in result["peaks"].items()),
             "ms per frame of 80 ms: thread CPU time (wall time in brackets); official = chunked_decode, 25 frames "
             "of left context; floors: arith = FLOPs / peak, roofline = per layer max(FLOPs / peak, weights / "
             "bandwidth)",
             "",
             f"{'precision':<9} {'chunk':>5} {'stream':>7} {'(wall)':>8} {'official':>9} {'(wall)':>8} "
             f"{'GFLOP':>6} {'arith':>6} {'roofline':>8} {'x arith':>7} {'x roof':>6} {'speed-up':>8}  note"]
    for r in result["rows"]:
        off, offw = r["official_ms"], r.get("official_wall_ms")
        speedup = f"{off / r['stream_ms']:.0f}x" if off else "-"
        wall = f"({r['stream_wall_ms']:.1f})"
        off_s, offw_s = (f"{off:.1f}", f"({offw:.1f})") if off else ("-", "")
        lines.append(
            f"{r['precision']:<9} {r['chunk_frames']:>5} {r['stream_ms']:>7.1f} {wall:>8} {off_s:>9} {offw_s:>8} "
            f"{r['flops_per_frame'] / 1e9:>6.2f} {r['arith_floor_ms']:>6.1f} {r['roofline_floor_ms']:>8.1f} "
            f"{r['x_arith']:>7.2f} {r['x_roofline']:>6.2f} {speedup:>8}  "
            + (f"OVERSUBSCRIBED (others {100 * r['other_cpu_frac']:.0f}%)" if r["oversubscribed"] else ""))
    for prec, per_chunk in result["stages"].items():
        for n in sorted(per_chunk):
            lines += ["", f"stages, {prec}, chunks of {n} frame(s): ms/frame (floors: arith / roofline; x roofline), "
                          "GFLOP/frame, weight MB read per chunk"]
            for name, s in per_chunk[n].items():
                x = s["ms"] / s["roofline_floor_ms"] if s["roofline_floor_ms"] > 0 else float("nan")
                lines.append(f"  {name:<13} {s['ms']:>7.2f}  ({s['arith_floor_ms']:>5.2f} / "
                             f"{s['roofline_floor_ms']:>5.2f}; {x:>5.2f}x)  {s['flops'] / 1e9:>6.3f}  "
                             f"{s['weight_bytes'] / 1e6:>6.1f}")
    return "\n".join(lines)
