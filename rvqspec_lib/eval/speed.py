"""How fast the inner-loop decoders really are: frame times measured interleaved, beside AR and the fused AR frame.

Tokens per call overstates speed, since a wider verify call costs more and the Python loop around the calls costs
time too (docs/style.md#benchmarks, docs/methods.md#reporting-speed). This module times whole frames:

* :func:`time_frames`: every (decoder, backend) condition decodes the same frames in a shuffled order each repeat
  (interleaved, so a load change on a shared machine hits every condition alike), after warm-up frames. Per frame it
  splits the wall time into the model call (the backend's ``forward``), the heads and embeddings (the backend's
  ``logits`` and ``embed`` and the drafter's ``draft_logits``: matmuls of the model's own weights) and what is left,
  the loop outside the model (masks, sampling, the accept walk, commit). Rows give medians and p10/p90, tokens per
  call, the loop's share, and the speedup over AR of the same backend and over the fused AR frame
  (:class:`rvqspec_lib.models.fused.FusedARFrame`).
* :func:`verify_cost_curve`: t(Q)/t(1) of one verify call of Q query positions, per backend.
* :func:`batch_throughput`: frames per second at several batch sizes.

Every result carries ``meta``: threads, dtype, device, torch version, CPU, whether the weights are random, repeats,
and how loaded the machine was (load average, share of CPU time taken by other processes while timing).

Every loop runs a fixed ``repeats`` rounds, or, given ``noise_target``, at least ``repeats`` and then round by round
until every condition's median has a relative standard error <= ``noise_target`` or ``max_repeats`` rounds
(:mod:`rvqspec_lib.eval.noise`); ``meta`` records the rounds made and the noise achieved per condition.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import random
import statistics
import time
from typing import Callable, Mapping, Sequence

import torch

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.eval import noise

#: Query sizes of the verify cost curve (a 64-node tree is the largest node budget calibrated).
QUERY_SIZES = (1, 2, 4, 8, 16, 32, 64)
#: Committed slots before the timed call of the cost curve (a frame has at most 16).
PREFIX_LEN = 8
#: Batch sizes of :func:`batch_throughput`.
BATCH_SIZES = (1, 4, 16)
#: Label of the fused AR frame's rows.
FUSED = "fused-AR"
#: Label of the fused speculative chain's rows, followed by its window (``fused-chain4``).
FUSED_SPEC = "fused-chain"


# ----------------------------------------------------------------------------------------------------------------
# Timing wrappers
# ----------------------------------------------------------------------------------------------------------------
class Clock:
    """Seconds accumulated in the model call (``model_s``) and in heads, embeddings and drafts (``heads_s``)."""

    def __init__(self):
        self.model_s = 0.0
        self.heads_s = 0.0

    def reset(self) -> None:
        self.model_s = self.heads_s = 0.0


class TimedBackend:
    """A :class:`~rvqspec_lib.decoding.predictor.VerifyBackend` that times another: ``forward`` into ``clock.model_s``,
    ``embed`` and ``logits`` into ``clock.heads_s`` (two ``perf_counter`` calls each, well under a microsecond)."""

    def __init__(self, backend, clock: Clock):
        self.backend, self.clock = backend, clock
        self.name = getattr(backend, "name", type(backend).__name__)

    def new_cache(self, batch, slots):
        return self.backend.new_cache(batch, slots)

    def forward(self, embeds, positions, allow, cache, write_slots):
        t0 = time.perf_counter()
        out = self.backend.forward(embeds, positions, allow, cache, write_slots)
        self.clock.model_s += time.perf_counter() - t0
        return out

    def compact(self, cache, order):
        self.backend.compact(cache, order)

    def embed(self, codes, depth):
        t0 = time.perf_counter()
        out = self.backend.embed(codes, depth)
        self.clock.heads_s += time.perf_counter() - t0
        return out

    def logits(self, hidden, head):
        t0 = time.perf_counter()
        out = self.backend.logits(hidden, head)
        self.clock.heads_s += time.perf_counter() - t0
        return out


class TimedDrafter:
    """A drafter whose ``draft_logits`` time goes into ``clock.heads_s``."""

    def __init__(self, drafter, clock: Clock):
        self.drafter, self.clock = drafter, clock
        self.takes_logits = bool(getattr(drafter, "takes_logits", False))

    def draft_logits(self, code_predictor, hidden, depth, n_ahead, **kwargs):
        t0 = time.perf_counter()
        out = self.drafter.draft_logits(code_predictor, hidden, depth, n_ahead, **kwargs)
        self.clock.heads_s += time.perf_counter() - t0
        return out


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------
def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _summary(xs: Sequence[float]) -> dict:
    return {"median": statistics.median(xs), "p10": _pct(xs, 10), "p90": _pct(xs, 90)}


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(v) - v[3] - v[4]) / tick, sum(v) / tick


class _LoadMonitor:
    """Load average and the share of the machine's CPU time used by OTHER processes over a timed run."""

    def __enter__(self):
        self.cpu0, self.own0, self.load0 = _cpu_times(), sum(os.times()[:2]), os.getloadavg()
        return self

    def __exit__(self, *exc):
        cpu1, own1 = _cpu_times(), sum(os.times()[:2])
        self.other_cpu_frac = None
        if self.cpu0 and cpu1 and cpu1[1] > self.cpu0[1]:
            busy, total = cpu1[0] - self.cpu0[0], cpu1[1] - self.cpu0[1]
            self.other_cpu_frac = max(0.0, min(1.0, (busy - (own1 - self.own0)) / total))
        self.load = (self.load0, os.getloadavg())
        return False

    def describe(self) -> dict:
        return {"load_avg_1min_before": round(self.load[0][0], 2), "load_avg_1min_after": round(self.load[1][0], 2),
                "other_cpu_frac": None if self.other_cpu_frac is None else round(self.other_cpu_frac, 3)}


def run_meta(code_predictor, *, random_weights: bool | None = None) -> dict:
    """What every timing is printed beside (docs/style.md#benchmarks)."""
    p = next(code_predictor.parameters())
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"threads": torch.get_num_threads(), "dtype": str(p.dtype).replace("torch.", ""), "device": str(p.device),
            "torch": torch.__version__, "cpu": cpu, "cpu_count": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "random_weights": random_weights}


def _check_contexts(code_predictor, contexts: torch.Tensor) -> torch.Tensor:
    h = P.talker_hidden_size(code_predictor)
    if not isinstance(contexts, torch.Tensor) or contexts.dim() != 3 or contexts.shape[1:] != (2, h) or \
            contexts.shape[0] < 1:
        shape = tuple(contexts.shape) if isinstance(contexts, torch.Tensor) else type(contexts).__name__
        raise ValueError(f"contexts must be a (N >= 1, 2, {h}) tensor (frames_from_shipped(...).context, or random "
                         f"contexts for random-weight models), got {shape}")
    return contexts.to(next(code_predictor.parameters()).device)


def random_contexts(code_predictor, n: int, *, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """``(n, 2, talker_hidden)`` standard normal contexts times ``scale`` (for random-weight models: timing only)."""
    h = P.talker_hidden_size(code_predictor)
    return scale * torch.randn(n, 2, h, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------------
# Frame times
# ----------------------------------------------------------------------------------------------------------------
def time_frames(code_predictor, contexts: torch.Tensor, decoders: Mapping[str, object],
                backends: Mapping[str, object], *, fused: Mapping[str, object] | None = None,
                fused_spec: Mapping[str, object] | None = None,
                sampling: Sampling | None = None, drafter=None, repeats: int = 20, warmup: int = 2, seed: int = 0,
                random_weights: bool | None = None, progress: bool = True, acceptance=None,
                noise_target: float | None = None, max_repeats: int | None = None) -> dict:
    """Time one frame (batch 1) of every decoder through every backend, interleaved (see the module docstring).

    Args:
        code_predictor: the official module. contexts: ``(N, 2, talker_hidden)``; repeat r decodes context
            ``r mod N`` under every condition (paired), with generator seed ``seed + r``.
        decoders: ``{label: AR() | Chain(n) | Tree(...)}``. Put ``AR()`` in to get ``speedup_vs_ar``.
        backends: ``{label: VerifyBackend}`` (e.g. ``{"official": OfficialBackend(cp), "lean":
            LeanCodePredictor(cp)}``).
        fused: ``{label: FusedARFrame}`` timed as extra conditions (decoder :data:`FUSED`); the first gives
            ``speedup_vs_fused``. Its noise generation counts in its frame time (as ``outside_ms``).
        fused_spec: ``{label: FusedChainFrame or a list of them}`` (:mod:`rvqspec_lib.models.fused_spec`, one graph a round) timed as
            extra conditions, decoder ``fused-chain{window}`` and ``nodes`` = the window (a frame with
            ``decoder_label`` and ``nodes``, e.g. :class:`~rvqspec_lib.models.fused_tree.FusedTreeFrame`: those); its uniforms count in its
            frame time (as ``outside_ms``), its compiled calls as ``model_ms``; build every round graph first
            (``compile_all``) or warm-up frames compile only the depths they meet.
        sampling: the code predictor's warpers (default: the checkpoints'). drafter: default reused heads.
        repeats: timed frames per condition (with ``noise_target``: the minimum). warmup: untimed frames per
            condition first (compiled backends compile there; their compile times are in ``meta["compile_s"]``).
            random_weights: recorded in ``meta``.
        noise_target: None (a fixed ``repeats``), or the relative standard error of every condition's median frame
            time to reach (:func:`rvqspec_lib.eval.noise.should_stop`; 0.02 = 2 %): rounds go on, interleaved,
            until it is reached or ``max_repeats`` (default 4 x ``repeats``). ``meta`` gets ``repeats`` (made),
            ``noise_target``, ``max_repeats``, ``rel_se`` (``{"decoder/backend": achieved}``), ``rel_se_max``.
        progress: a progress bar over the repeats (its total is ``max_repeats``).
        acceptance: a TIMING REPLAY's :class:`~rvqspec_lib.decoding.replay.AcceptanceOracle`, passed to every
            ``decode_frame`` (the fused frames compute their own acceptance: leave them out); ``meta["replay"]``
            then holds its words.

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per condition: ``decoder``, ``backend``, ``tokens_per_call``
        (mean over the first ``repeats`` timed frames, prefill included: the rounds every run makes, so it does
        not depend on how many more the noise target asked for), ``calls_per_frame`` (the same frames),
        ``ms_per_frame`` (median),
        ``p10_ms``, ``p90_ms``, ``model_ms`` (in the backend's forward), ``heads_ms`` (heads, embeddings, drafts),
        ``outside_ms`` (the rest: the loop outside the model), ``outside_share`` (of the frame),
        ``outside_forward_share`` (everything but the forward, heads included), ``speedup_vs_ar`` (AR of the same
        backend, ratio of medians), ``speedup_vs_fused``. Per-frame medians of the parts need not add up exactly.

    Raises:
        ValueError: bad contexts, ``repeats < 1``, no condition, bad noise settings
            (:func:`rvqspec_lib.eval.noise.repeat_cap`).
    """
    contexts = _check_contexts(code_predictor, contexts)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    cap = noise.repeat_cap(noise_target, repeats, max_repeats)
    if not (decoders and backends) and not fused and not fused_spec:
        raise ValueError("nothing to time: give decoders and backends, or a fused frame")
    sampling = Sampling() if sampling is None else sampling
    drafter = ReusedHeads() if drafter is None else drafter
    clock = Clock()
    timed_drafter = TimedDrafter(drafter, clock)
    conditions: dict[tuple[str, str], Callable[[torch.Tensor, torch.Generator], tuple]] = {}
    for bname, backend in backends.items():
        tb = TimedBackend(backend, clock)
        for dname, dec in decoders.items():
            if getattr(dec, "drafter", None) is not None:  # a decoder with its own drafter (the paper's): time that
                dec = dataclasses.replace(dec, drafter=TimedDrafter(dec.drafter, clock))

            def run(ctx, gen, dec=dec, tb=tb):
                res = decode_frame(code_predictor, ctx, decoder=dec, sampling=sampling, generator=gen,
                                   drafter=timed_drafter, backend=tb, acceptance=acceptance)
                return float(res.tokens_per_call.mean()), float(res.calls.float().mean())
            conditions[(dname, bname)] = run
    for fname, frame in (fused or {}).items():
        def run_fused(ctx, gen, frame=frame):
            noise = frame.noise(ctx.shape[0], gen)  # outside the call: it counts as outside_ms
            t0 = time.perf_counter()
            frame(ctx, noise)
            clock.model_s += time.perf_counter() - t0
            return None, 1.0
        conditions[(FUSED, fname)] = run_fused
    spec_frames = [(fname, f) for fname, fs in (fused_spec or {}).items()
                   for f in (fs if isinstance(fs, (list, tuple)) else [fs])]
    spec_nodes: dict[str, int] = {}
    for fname, frame in spec_frames:
        def run_spec(ctx, gen, frame=frame):
            u = frame.uniforms(ctx.shape[0], gen)  # outside the calls: it counts as outside_ms
            t0 = time.perf_counter()
            frame(ctx, u)
            clock.model_s += time.perf_counter() - t0
            calls = statistics.fmean(frame.last_calls)
            return frame.n_codes / calls, calls
        label = getattr(frame, "decoder_label", f"{FUSED_SPEC}{frame.window}")  # fused-tree<N> for a tree frame
        spec_nodes[label] = int(getattr(frame, "nodes", frame.window))
        conditions[(label, fname)] = run_spec
    keys = list(conditions)
    n_ctx = contexts.shape[0]
    for key in keys:  # warm-up (and compilation)
        for w in range(warmup):
            conditions[key](contexts[w % n_ctx: w % n_ctx + 1], torch.Generator().manual_seed(seed + 10_000 + w))
    per = {k: {"frame": [], "model": [], "heads": [], "tpc": [], "calls": []} for k in keys}
    frame_ms = {k: per[k]["frame"] for k in keys}  # what the stopping rule looks at
    order = random.Random(seed)
    with _LoadMonitor() as load:
        for r in progress_bar(range(cap), total=cap, desc="frames", enabled=progress, unit="repeat"):
            ctx = contexts[r % n_ctx: r % n_ctx + 1]
            order.shuffle(keys)
            for key in keys:
                gen = torch.Generator().manual_seed(seed + r)
                clock.reset()
                t0 = time.perf_counter()
                tpc, calls = conditions[key](ctx, gen)
                dt = time.perf_counter() - t0
                d = per[key]
                d["frame"].append(dt * 1e3)
                d["model"].append(clock.model_s * 1e3)
                d["heads"].append(clock.heads_s * 1e3)
                d["tpc"].append(tpc)
                d["calls"].append(calls)
            if noise.should_stop(frame_ms, noise_target, repeats, cap):
                break
    rows = []
    for key in conditions:
        d = per[key]
        fr = _summary(d["frame"])
        outside = [f - m - h for f, m, h in zip(d["frame"], d["model"], d["heads"])]
        nodes = {"nodes": spec_nodes[key[0]]} if key[0] in spec_nodes else {}
        rows.append({"decoder": key[0], "backend": key[1], **nodes,
                     # over the first `repeats` rounds, which every run makes (docs/reproducibility.md)
                     "tokens_per_call": None if key[0] == FUSED else statistics.fmean(d["tpc"][:repeats]),  # 1 call
                     "calls_per_frame": statistics.fmean(d["calls"][:repeats]),
                     "ms_per_frame": fr["median"], "p10_ms": fr["p10"], "p90_ms": fr["p90"],
                     "model_ms": statistics.median(d["model"]), "heads_ms": statistics.median(d["heads"]),
                     "outside_ms": statistics.median(outside),
                     "outside_share": statistics.median([o / f for o, f in zip(outside, d["frame"])]),
                     "outside_forward_share": statistics.median(
                         [(f - m) / f for f, m in zip(d["frame"], d["model"])])})
    ar = {r["backend"]: r["ms_per_frame"] for r in rows if isinstance(decoders.get(r["decoder"]), AR)}
    fused_ms = next((r["ms_per_frame"] for r in rows if r["decoder"] == FUSED), None)
    for r in rows:
        r["speedup_vs_ar"] = ar[r["backend"]] / r["ms_per_frame"] if r["backend"] in ar else None
        r["speedup_vs_fused"] = fused_ms / r["ms_per_frame"] if fused_ms else None
    meta = {**run_meta(code_predictor, random_weights=random_weights), "warmup": warmup,
            **noise.noise_meta({f"{k[0]}/{k[1]}": frame_ms[k] for k in conditions}, noise_target, cap),
            "n_contexts": int(n_ctx), "seed": seed, "sampling": repr(sampling),
            "drafter": getattr(drafter, "name", type(drafter).__name__), **load.describe(),
            "compile_s": {name: {str(k): round(v, 1) for k, v in getattr(b, "compile_s", {}).items()}
                          for name, b in {**backends, **(fused or {})}.items() if getattr(b, "compile_s", None)},
            "fused_spec_compile_s": {f"{name}/{f.name}": round(sum(f.compile_s.values()), 1)
                                     for name, f in spec_frames if getattr(f, "compile_s", None)}}
    if acceptance is not None:
        meta["replay"] = acceptance.text
    return {"rows": rows, "meta": meta}


# ----------------------------------------------------------------------------------------------------------------
# Verify cost curve
# ----------------------------------------------------------------------------------------------------------------
def _verify_call(code_predictor, backend, q: int, prefix_len: int, seed: int) -> Callable[[], object]:
    """One verify call of ``q`` positions after ``prefix_len`` committed slots, as a closure (the prefix is written
    once; every call rewrites the same ``q`` slots, so repeated calls see the same cache)."""
    g = torch.Generator().manual_seed(seed)
    p0 = next(code_predictor.parameters())
    hid = int(code_predictor.config.hidden_size)
    slots = prefix_len + q
    cache = backend.new_cache(1, slots)
    slot = torch.arange(slots, device=p0.device)
    with torch.inference_mode():
        pre = torch.randn(1, prefix_len, hid, generator=g).to(p0)
        idx = slot[None, :prefix_len]
        backend.forward(pre, idx, (slot[None, None, :] <= slot[None, :prefix_len, None]), cache, idx)
    x = torch.randn(1, q, hid, generator=g).to(p0)
    idx = slot[None, prefix_len:]
    allow = slot[None, None, :] <= slot[None, prefix_len:, None]  # (1, Q, S): the prefix and a causal block

    def call():
        with torch.inference_mode():
            return backend.forward(x, idx, allow, cache, idx)
    return call


def verify_cost_curve(code_predictor, backends: Mapping[str, object], *, query_sizes: Sequence[int] = QUERY_SIZES,
                      prefix_len: int = PREFIX_LEN, repeats: int = 20, warmup: int = 3, seed: int = 0,
                      random_weights: bool | None = None, progress: bool = True,
                      noise_target: float | None = None, max_repeats: int | None = None) -> dict:
    """t(Q)/t(1) of one verify call (the backend's ``forward`` alone) per backend, interleaved.

    Args:
        backends: ``{label: VerifyBackend}``. query_sizes: Q values (1 must be among them for the ratio).
        prefix_len: committed slots before the call. repeats, warmup, seed, random_weights, progress,
            noise_target, max_repeats: as :func:`time_frames` (all (backend, Q) calls shuffled each repeat; the
            target applies to every (backend, Q) call's median, ``rel_se`` keys ``"backend/Q"``).

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per (backend, Q): ``backend``, ``query_positions``, ``median_ms``,
        ``p10_ms``, ``p90_ms``, ``ratio_to_q1`` (median over median at Q = 1).

    Raises:
        ValueError: Q = 1 missing, a Q < 1, ``repeats < 1``, bad noise settings.
    """
    qs = sorted({int(q) for q in query_sizes})
    if 1 not in qs or qs[0] < 1:
        raise ValueError(f"query_sizes must be positive and include 1 (the ratio's reference), got {query_sizes}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    cap = noise.repeat_cap(noise_target, repeats, max_repeats)
    calls = {(b, q): _verify_call(code_predictor, be, q, prefix_len, seed) for b, be in backends.items() for q in qs}
    keys = list(calls)
    for _ in range(warmup):
        for k in keys:
            calls[k]()
    times = {k: [] for k in keys}
    order = random.Random(seed)
    with _LoadMonitor() as load:
        for _ in progress_bar(range(cap), total=cap, desc="verify cost", enabled=progress, unit="repeat"):
            order.shuffle(keys)
            for k in keys:
                t0 = time.perf_counter()
                calls[k]()
                times[k].append((time.perf_counter() - t0) * 1e3)
            if noise.should_stop(times, noise_target, repeats, cap):
                break
    rows = []
    for b in backends:
        base = statistics.median(times[(b, 1)])
        for q in qs:
            s = _summary(times[(b, q)])
            rows.append({"backend": b, "query_positions": q, "median_ms": s["median"], "p10_ms": s["p10"],
                         "p90_ms": s["p90"], "ratio_to_q1": s["median"] / base})
    meta = {**run_meta(code_predictor, random_weights=random_weights), "warmup": warmup,
            **noise.noise_meta({f"{b}/{q}": times[(b, q)] for b in backends for q in qs}, noise_target, cap),
            "prefix_len": prefix_len, **load.describe(),
            "compile_s": {name: {str(k): round(v, 1) for k, v in getattr(b, "compile_s", {}).items()}
                          for name, b in backends.items() if getattr(b, "compile_s", None)}}
    return {"rows": rows, "meta": meta}


# ----------------------------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------------------------
def batch_throughput(code_predictor, contexts: torch.Tensor, decoders: Mapping[str, object],
                     backends: Mapping[str, object], *, batch_sizes: Sequence[int] = BATCH_SIZES,
                     fused: Mapping[str, object] | None = None, sampling: Sampling | None = None, drafter=None,
                     repeats: int = 5, warmup: int = 1, seed: int = 0, random_weights: bool | None = None,
                     progress: bool = True, noise_target: float | None = None,
                     max_repeats: int | None = None) -> dict:
    """Frames per second of batched decoding: one ``decode_frame`` call over B frames per measurement, every
    (decoder, backend, B) condition interleaved.

    Args:
        contexts: ``(N, 2, talker_hidden)``; a batch of B takes B consecutive rows (wrapping around), starting at
            ``r * B`` in repeat r. batch_sizes: the Bs. fused: ``{label: FusedARFrame}`` as extra conditions (one
            compiled graph per batch size). Others as :func:`time_frames` (``noise_target`` applies to every
            condition's median batch time, ``rel_se`` keys ``"decoder/backend/B"``).

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per condition: ``decoder``, ``backend``, ``batch``,
        ``ms_per_batch`` (median), ``p10_ms``, ``p90_ms``, ``frames_per_s`` (B / median), ``tokens_per_call`` (the
        batch's calls are those of its slowest row; mean over the first ``repeats`` rounds, as in
        :func:`time_frames`), ``speedup_vs_ar`` (frames per second over AR of the same backend and batch).

    Raises:
        ValueError: bad contexts or batch sizes, bad noise settings.
    """
    contexts = _check_contexts(code_predictor, contexts)
    cap = noise.repeat_cap(noise_target, repeats, max_repeats)
    bs = [int(b) for b in batch_sizes]
    if not bs or min(bs) < 1:
        raise ValueError(f"batch sizes must be >= 1, got {batch_sizes}")
    sampling = Sampling() if sampling is None else sampling
    drafter = ReusedHeads() if drafter is None else drafter
    n_ctx = contexts.shape[0]

    def batch_of(b: int, r: int) -> torch.Tensor:
        idx = (torch.arange(b) + r * b) % n_ctx
        return contexts[idx.to(contexts.device)]

    conditions = {}
    for bname, backend in backends.items():
        for dname, dec in decoders.items():
            for b in bs:
                def run(ctx, gen, dec=dec, backend=backend):
                    res = decode_frame(code_predictor, ctx, decoder=dec, sampling=sampling, generator=gen,
                                       drafter=drafter, backend=backend)
                    return ctx.shape[0] * res.codes.shape[1] / res.n_model_calls
                conditions[(dname, bname, b)] = run
    for fname, frame in (fused or {}).items():
        for b in bs:
            conditions[(FUSED, fname, b)] = lambda ctx, gen, frame=frame: (frame.decode(ctx, gen), None)[1]
    keys = list(conditions)
    for k in keys:
        for w in range(warmup):
            conditions[k](batch_of(k[2], w), torch.Generator().manual_seed(seed + 10_000 + w))
    times = {k: [] for k in keys}
    tpc = {k: [] for k in keys}
    order = random.Random(seed)
    with _LoadMonitor() as load:
        for r in progress_bar(range(cap), total=cap, desc="batches", enabled=progress, unit="repeat"):
            order.shuffle(keys)
            for k in keys:
                ctx = batch_of(k[2], r)
                t0 = time.perf_counter()
                out = conditions[k](ctx, torch.Generator().manual_seed(seed + r))
                times[k].append((time.perf_counter() - t0) * 1e3)
                if out is not None:
                    tpc[k].append(out / k[2])
            if noise.should_stop(times, noise_target, repeats, cap):
                break
    rows = []
    for k in conditions:
        s = _summary(times[k])
        rows.append({"decoder": k[0], "backend": k[1], "batch": k[2], "ms_per_batch": s["median"],
                     "p10_ms": s["p10"], "p90_ms": s["p90"], "frames_per_s": k[2] / (s["median"] / 1e3),
                     "tokens_per_call": statistics.fmean(tpc[k][:repeats]) if tpc[k] else None})
    ar = {(r["backend"], r["batch"]): r["frames_per_s"] for r in rows if isinstance(decoders.get(r["decoder"]), AR)}
    for r in rows:
        base = ar.get((r["backend"], r["batch"]))
        r["speedup_vs_ar"] = r["frames_per_s"] / base if base else None
    meta = {**run_meta(code_predictor, random_weights=random_weights), "warmup": warmup,
            **noise.noise_meta({"/".join(map(str, k)): times[k] for k in conditions}, noise_target, cap),
            "n_contexts": int(n_ctx), "seed": seed, "sampling": repr(sampling), **load.describe()}
    return {"rows": rows, "meta": meta}


def format_rows(rows: Sequence[dict], columns: Sequence[str] | None = None, digits: int = 2) -> str:
    """A Markdown table of result rows (floats rounded to ``digits``)."""
    if not rows:
        return ""
    cols = list(columns or rows[0].keys())

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return "" if v is None else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
