"""Time the streaming codec decoder against the official ``chunked_decode`` and against its floors
(docs/codec_streaming.md).

What is measured, per precision (float32; bfloat16 where the CPU has AVX512-BF16 or AMX-BF16) and chunk size n:

* **streaming**: :class:`rvqspec_lib.models.streaming_codec.StreamingCodecDecoder` (``onednn`` backend by default)
  on a stream already past the transformer's 72-frame attention window (steady state), one chunk of n frames per
  timed call, each stage timed (:meth:`StreamingCodecDecoder.stages`);
* **official chunked_decode**: in steady state each chunk of ``chunked_decode(codes, chunk_size=n,
  left_context_size=25)`` is one official ``forward`` over 25 + n frames whose first 25 frames' audio is dropped;
  that call is timed and divided by n;
* **floors**: the arithmetic floor ``FLOPs per frame / peak`` (FLOPs of the official layers' matmuls, convolutions and
  attention by ``torch.utils.flop_counter.FlopCounterMode``; peak = the best rate oneDNN reaches on the decoder's own
  convolution and matmul shapes with their weights in cache, :func:`peak_gflops`), and the roofline floor that adds
  the weights a chunk must read from memory: per stage ``max(FLOPs / peak, weight bytes / read bandwidth)``, summed
  (read bandwidth from :func:`rvqspec_lib.eval.floor.read_bandwidth`). A stream of chunks of n frames reads every
  weight of the decoder once per chunk (114 M parameters; a 32 MiB last-level cache holds a tenth of them), so at
  small n the roofline floor, not the arithmetic one, is what an implementation can approach.

Every timing is the median (and the minimum) over repeated chunks, at one torch thread unless told otherwise, with
the share of the CPU that other processes used meanwhile (:func:`rvqspec_lib.eval.bench.other_cpu_fraction`); the
real-size decoder has RANDOM weights (:func:`rvqspec_lib.models.configs.build_codec_decoder`): timing only.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from rvqspec_lib.eval.bench import _cpu_snapshot, cpu_oversubscribed, other_cpu_fraction
from rvqspec_lib.eval.floor import read_bandwidth
from rvqspec_lib.models.configs import build_codec_decoder
from rvqspec_lib.models.precision import cpu_flags, native_precisions
from rvqspec_lib.models.streaming_codec import StreamingCodecDecoder

#: Chunk sizes of the table (frames of 80 ms).
CHUNK_FRAMES = (1, 2, 4, 8)
#: The official ``chunked_decode``'s default left context (frames recomputed before every chunk).
LEFT_CONTEXT = 25
#: Frames pushed before timing: past the released transformer's attention window (72), so the KV cache is full.
WARMUP_FRAMES = 80
#: CPU flags printed beside the CPU's name.
SHOWN_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cpu_description() -> dict:
    """``{"model": lscpu's model name, "flags": {flag: present} for SHOWN_FLAGS, "cores": os.cpu_count()}``."""
    model = "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), model)
    except (OSError, subprocess.SubprocessError):
        pass
    flags = cpu_flags()
    return {"model": model, "flags": {f: f in flags for f in SHOWN_FLAGS}, "cores": os.cpu_count()}


def _codes(n_frames: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, 16, n_frames), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------------------ counts
def stage_flops(decoder, chunk_frames: int) -> dict[str, float]:
    """FLOPs per FRAME of each stage of :meth:`StreamingCodecDecoder.stages` for chunks of ``chunk_frames`` frames
    in steady state (the ``official`` backend, whose aten convolutions, matmuls and attention
    ``FlopCounterMode`` counts; the ``onednn`` backend runs the same arithmetic)."""
    dec = StreamingCodecDecoder(decoder, backend="official")
    codes = _codes(WARMUP_FRAMES + chunk_frames)
    with torch.no_grad():
        for i in range(0, WARMUP_FRAMES, chunk_frames):  # fill the window
            dec.push(codes[..., i:i + chunk_frames])
        out = {}
        h = codes[..., WARMUP_FRAMES:WARMUP_FRAMES + chunk_frames]
        for name, stage in dec.stages():
            with FlopCounterMode(display=False) as fc:
                h = stage(h)
            out[name] = fc.get_total_flops() / chunk_frames
    return out


def _stage_modules(decoder) -> dict[str, list]:
    d = decoder
    blocks = d.decoder
    return {"rvq+pre_conv": [d.quantizer.rvq_first.output_proj, d.quantizer.rvq_rest.output_proj, d.pre_conv],
            "transformer": [d.pre_transformer], "upsample": [d.upsample], "conv_in": [blocks[0]],
            **{f"block{i}": [b] for i, b in enumerate(blocks[1:-2])}, "conv_out": [blocks[-2], blocks[-1]]}


def stage_weight_bytes(decoder, chunk_frames: int = 1) -> dict[str, int]:
    """Bytes of weights each stage reads per chunk: all its parameters (at their stored size), except the codebooks,
    of which only the ``16 * chunk_frames`` rows looked up are read."""
    out = {}
    for name, mods in _stage_modules(decoder).items():
        out[name] = sum(p.numel() * p.element_size() for m in mods for p in m.parameters())
    row = decoder.config.codebook_dim // 2
    out["rvq+pre_conv"] += 16 * chunk_frames * row * next(decoder.parameters()).element_size()
    return out


# ------------------------------------------------------------------------------------------------------------- peak
def _shapes(decoder) -> list[tuple]:
    """Distinct (kind, c_in, c_out, kernel, dilation, groups, stride, samples per frame) of the decoder's conv and
    linear layers."""
    out, spf = [], 1
    d = decoder

    def conv(m, spf, kind="conv"):
        c = m.conv
        out.append((kind, c.in_channels, c.out_channels, c.kernel_size[0], c.dilation[0], c.groups, c.stride[0], spf))

    conv(d.pre_conv, 1)
    cfg = d.config
    out.append(("linear", cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim * 3, 1, 1, 1, 1, 1))
    out.append(("linear", cfg.hidden_size, cfg.intermediate_size * 2, 1, 1, 1, 1, 1))
    for tc, cnx in d.upsample:
        conv(tc, spf, "tconv")
        spf *= tc.conv.stride[0]
        conv(cnx.dwconv, spf)
        out.append(("linear", cnx.pwconv1.in_features, cnx.pwconv1.out_features, 1, 1, 1, 1, spf))
    conv(d.decoder[0], spf)
    for b in d.decoder[1:-2]:
        conv(b.block[1], spf, "tconv")
        spf *= b.block[1].conv.stride[0]
        for u in b.block[2:]:
            conv(u.conv1, spf)
        conv(b.block[2].conv2, spf)
    conv(d.decoder[-1], spf)
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def peak_gflops(decoder, *, frames: int = 8, repeats: int = 7) -> dict:
    """The core's compute rate on the decoder's own convolution and matmul shapes: each distinct shape (a chunk of
    ``frames`` frames: 8 gives every layer at least 8 samples) run by oneDNN from a prepacked weight in the
    decoder's dtype, weights and activations hot in cache, best of ``repeats``.

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
            w = (torch.randn(co, ci // g, 1, k, generator=gen) * 0.02).to(dt).contiguous(memory_format=torch.channels_last)
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
        fn()
        best = min(_timed(fn) for _ in range(repeats))
        rows.append({"shape": f"{kind} {ci}->{co} k{k} d{dil} g{g} s{s} x{t}", "gflops": flops / best / 1e9})
    return {"peak_gflops": max(r["gflops"] for r in rows), "shapes": rows, "dtype": str(dt).replace("torch.", ""),
            "threads": torch.get_num_threads()}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------------------ times
def time_streaming(decoder, chunk_frames: int, *, backend: str = "onednn", repeats: int = 12) -> dict:
    """Per-stage wall time of :class:`StreamingCodecDecoder` on chunks of ``chunk_frames`` frames, in steady state.

    Returns:
        ``{"ms_per_frame": median over the timed chunks, "min_ms_per_frame", "stages_ms_per_frame": {stage: median},
        "other_cpu_frac"}``.
    """
    dec = StreamingCodecDecoder(decoder, backend=backend, chunk_frames_hint=chunk_frames)
    codes = _codes(WARMUP_FRAMES + chunk_frames * repeats, seed=1)
    stages = dec.stages()
    per_stage = {name: [] for name, _ in stages}
    totals = []
    with torch.no_grad():
        for i in range(0, WARMUP_FRAMES, chunk_frames):
            dec.push(codes[..., i:i + chunk_frames])
        before = _cpu_snapshot()
        for r in range(repeats):
            i = WARMUP_FRAMES + r * chunk_frames
            h = codes[..., i:i + chunk_frames]
            t_all = time.perf_counter()
            for name, stage in stages:
                t0 = time.perf_counter()
                h = stage(h)
                per_stage[name].append((time.perf_counter() - t0) * 1e3 / chunk_frames)
            totals.append((time.perf_counter() - t_all) * 1e3 / chunk_frames)
        after = _cpu_snapshot()
    return {"ms_per_frame": statistics.median(totals), "min_ms_per_frame": min(totals),
            "stages_ms_per_frame": {k: statistics.median(v) for k, v in per_stage.items()},
            "other_cpu_frac": other_cpu_fraction(before, after)}


def time_chunked_decode(decoder, chunk_frames: int, *, left_context: int = LEFT_CONTEXT, repeats: int = 3) -> dict:
    """The official ``chunked_decode(codes, chunk_size=chunk_frames, left_context_size=left_context)`` in steady
    state: one official ``forward`` over ``left_context + chunk_frames`` frames per chunk, timed, per frame.

    Returns:
        ``{"ms_per_frame": median, "min_ms_per_frame", "other_cpu_frac"}``.
    """
    codes = _codes(left_context + chunk_frames, seed=2)
    times = []
    with torch.no_grad():
        decoder(codes)
        before = _cpu_snapshot()
        for _ in range(repeats):
            times.append(_timed(lambda: decoder(codes)) * 1e3 / chunk_frames)
        after = _cpu_snapshot()
    return {"ms_per_frame": statistics.median(times), "min_ms_per_frame": min(times),
            "other_cpu_frac": other_cpu_fraction(before, after)}


def streaming_table(*, precisions: tuple[str, ...] | None = None, chunk_frames: tuple[int, ...] = CHUNK_FRAMES,
                    config: str = "released", threads: int = 1, repeats: int = 12, official_repeats: int = 3,
                    official: bool = True) -> dict:
    """The benchmark table: ms per frame of the streaming decoder vs the official ``chunked_decode`` vs the floors,
    per precision and chunk size, with a per-stage breakdown (module docstring).

    Args:
        precisions: default the native ones of this CPU among float32 and bfloat16
            (:func:`rvqspec_lib.models.precision.native_precisions`).
        chunk_frames: chunk sizes in frames.
        config: ``"released"`` (the real-size decoder, random weights) or ``"tiny"``.
        threads: torch threads (``torch.set_num_threads``; restored after).
        official: also time the official ``chunked_decode`` (slow: about 1 s a chunk in float32).
    Returns:
        ``{"cpu", "threads", "bandwidth_gb_per_s", "config", "random_weights": True, "rows": [...], "peaks": {...},
        "stages": {...}}``; each row has ``precision``, ``chunk_frames``, ``stream_ms``, ``stream_min_ms``,
        ``official_ms``, ``flops_per_frame``, ``arith_floor_ms``, ``roofline_floor_ms``, ``x_arith``, ``x_roofline``,
        ``other_cpu_frac``, ``oversubscribed``; ``stages[precision][chunk]`` maps each stage to its ms per frame,
        FLOPs per frame, weight bytes and floors.
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
        bw = read_bandwidth()["gb_per_s"]
        out = {"cpu": cpu_description(), "threads": threads, "bandwidth_gb_per_s": bw, "config": config,
               "random_weights": True, "rows": [], "peaks": {}, "stages": {}}
        for prec in precisions:
            decoder = build_codec_decoder(config, dtype=DTYPES[prec])
            peak = peak_gflops(decoder)
            out["peaks"][prec] = peak
            out["stages"][prec] = {}
            for n in chunk_frames:
                flops = stage_flops(decoder, n)
                wbytes = stage_weight_bytes(decoder, n)
                st = time_streaming(decoder, n, repeats=repeats)
                off = time_chunked_decode(decoder, n, repeats=official_repeats) if official else None
                gf = peak["peak_gflops"] * 1e9
                stages = {}
                for name in flops:
                    arith = flops[name] / gf * 1e3
                    mem = wbytes[name] / (bw * 1e9) * 1e3 / n
                    stages[name] = {"ms": st["stages_ms_per_frame"][name], "flops": flops[name],
                                    "weight_bytes": wbytes[name], "arith_floor_ms": arith,
                                    "roofline_floor_ms": max(arith, mem)}
                out["stages"][prec][n] = stages
                total_flops = sum(flops.values())
                arith = total_flops / gf * 1e3
                roof = sum(s["roofline_floor_ms"] for s in stages.values())
                row = {"precision": prec, "chunk_frames": n, "stream_ms": st["ms_per_frame"],
                       "stream_min_ms": st["min_ms_per_frame"], "official_ms": off and off["ms_per_frame"],
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
    """The table of :func:`streaming_table` as text: the CPU line, one row per precision x chunk size, then the
    per-stage breakdown of each precision's smallest and largest chunk."""
    cpu = result["cpu"]
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["flags"].items())
    lines = [f"CPU: {cpu['model']} ({cpu['cores']} cores; {flags})",
             f"torch threads {result['threads']}; read bandwidth {result['bandwidth_gb_per_s']:.1f} GB/s; config "
             f"{result['config']} with RANDOM weights (timing only)",
             "peak (best oneDNN rate on the decoder's own shapes): " + ", ".join(
                 f"{p} {v['peak_gflops']:.0f} GFLOP/s" for p, v in result["peaks"].items()),
             "",
             f"{'precision':<9} {'chunk':>5} {'stream ms/fr':>12} {'(min)':>7} {'official':>9} {'GFLOP/fr':>8} "
             f"{'arith floor':>11} {'roofline':>8} {'x arith':>7} {'x roof':>6} {'speed-up':>8}  note"]
    for r in result["rows"]:
        off = r["official_ms"]
        speedup = f"{off / r['stream_ms']:.1f}x" if off else "-"
        lines.append(
            f"{r['precision']:<9} {r['chunk_frames']:>5} {r['stream_ms']:>12.1f} {r['stream_min_ms']:>7.1f} "
            f"{(f'{off:.1f}' if off else '-'):>9} {r['flops_per_frame'] / 1e9:>8.2f} {r['arith_floor_ms']:>11.1f} "
            f"{r['roofline_floor_ms']:>8.1f} {r['x_arith']:>7.2f} {r['x_roofline']:>6.2f} "
            f"{speedup:>8}  "
            + (f"OVERSUBSCRIBED (others {100 * r['other_cpu_frac']:.0f}%)" if r["oversubscribed"] else ""))
    for prec, per_chunk in result["stages"].items():
        for n in sorted({min(per_chunk), max(per_chunk)}):
            lines += ["", f"stages, {prec}, chunks of {n} frame(s): ms/frame (floors: arith / roofline), "
                          "GFLOP/frame, weight MB per chunk"]
            for name, s in per_chunk[n].items():
                lines.append(f"  {name:<13} {s['ms']:>7.2f}  ({s['arith_floor_ms']:>5.2f} / "
                             f"{s['roofline_floor_ms']:>5.2f})  {s['flops'] / 1e9:>6.3f}  {s['weight_bytes'] / 1e6:>6.1f}")
    return "\n".join(lines)
