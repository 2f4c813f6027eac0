"""How fast the inner-loop decoders really are: whole frames timed interleaved and the verify cost curve
(docs/methods.md#reporting-speed and #choosing-the-node-budget), what ``auto`` chooses by and the benchmarks
(bench/) build on. Everything times through :func:`rvqspec_lib.eval.timing.interleaved` over the registry's
runners."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Mapping, Sequence

import torch

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.eval.timing import device_sync, interleaved, summary
from rvqspec_lib.models.backends import (
    SteppedRunner,
    available,
    frame_runner,
    fused_support,
    runner_fields,
    verify_backend,
)
from rvqspec_lib.device.precision import precision_of

#: Query sizes of the verify cost curve (a 64-node tree is the largest node budget calibrated).
QUERY_SIZES = (1, 2, 4, 8, 16, 32, 64)
#: Committed slots before the timed call of the cost curve (a frame has at most 16).
PREFIX_LEN = 8


# ----------------------------------------------------------------------------------------------------------------
# Where a stepped frame's time goes
# ----------------------------------------------------------------------------------------------------------------
class Clock:
    """Seconds accumulated in the model call (``model_s``) and in heads, embeddings and drafts (``heads_s``)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.model_s = self.heads_s = 0.0

    def timed(self, fn, field: str):
        """``fn`` with the seconds of each call added to ``field`` (two ``perf_counter`` calls, under a microsecond)."""
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - t0)
        return run


class TimedBackend:
    """A verify backend that times another: ``forward`` into ``clock.model_s``, ``embed`` and ``logits`` into
    ``clock.heads_s``."""

    def __init__(self, backend, clock: Clock):
        self.backend, self.name = backend, getattr(backend, "name", type(backend).__name__)
        self.new_cache, self.compact = backend.new_cache, backend.compact
        self.forward = clock.timed(backend.forward, "model_s")
        self.embed, self.logits = clock.timed(backend.embed, "heads_s"), clock.timed(backend.logits, "heads_s")


class TimedDrafter:
    """A drafter whose ``draft_logits`` time goes into ``clock.heads_s``."""

    def __init__(self, drafter, clock: Clock):
        self.drafter, self.name = drafter, getattr(drafter, "name", None)
        self.draft_logits = clock.timed(drafter.draft_logits, "heads_s")


def _timed(runner, clock: Clock):
    """A stepped runner whose backend and drafter report to ``clock`` (a fused runner as it is)."""
    if not isinstance(runner, SteppedRunner):
        return runner
    dec = runner.decoder
    if getattr(dec, "drafter", None) is not None:  # a decoder with its own drafter (the paper's): time that one
        dec = dataclasses.replace(dec, drafter=TimedDrafter(dec.drafter, clock))
    timed = SteppedRunner(runner.code_predictor, dec, TimedBackend(runner.verify, clock), sampling=runner.sampling,
                          drafter=TimedDrafter(runner.drafter or ReusedHeads(), clock),
                          acceptance=runner.acceptance, backend=runner.backend)
    timed.name = runner.name
    return timed


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------
def _frame_inputs(runners: Sequence, contexts: torch.Tensor) -> tuple:
    """``(code_predictor, contexts)`` on its device, after checking their shape ``(N >= 1, 2, talker_hidden)``.

    Raises:
        ValueError: no runner, or another shape (one line naming where contexts come from).
    """
    if not runners:
        raise ValueError("nothing to time: give at least one frame runner")
    code_predictor = runners[0].code_predictor
    h = P.talker_hidden_size(code_predictor)
    if not isinstance(contexts, torch.Tensor) or contexts.dim() != 3 or contexts.shape[1:] != (2, h) or \
            contexts.shape[0] < 1:
        shape = tuple(contexts.shape) if isinstance(contexts, torch.Tensor) else type(contexts).__name__
        raise ValueError(f"contexts must be a (N >= 1, 2, {h}) tensor (frames_from_shipped(...).context, or "
                         f"random_contexts for random-weight models), got {shape}")
    return code_predictor, contexts.to(next(code_predictor.parameters()).device)


def random_contexts(code_predictor, n: int, *, seed: int = 0) -> torch.Tensor:
    """``(n, 2, talker_hidden)`` standard normal contexts (for random-weight models: timing only)."""
    return torch.randn(n, 2, P.talker_hidden_size(code_predictor), generator=torch.Generator().manual_seed(seed))


def _generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def build_runners(backends: Sequence[str], code_predictor, decoders, *, fused: bool = True, sampling=None,
                  acceptance=None) -> tuple[list, dict]:
    """The frame runners of every decoder through every backend present: stepped through ONE verify backend per name
    and, with ``fused``, the whole-frame runner of each decoder that has one.

    Args:
        backends: names of :data:`rvqspec_lib.models.backends.BACKENDS`. code_predictor: the official module, in the
            precision and on the device wanted. decoders: ``NamedDecoder`` s (a mapping's values are taken) or bare
            decoders. sampling: as ``decode_frame``. acceptance: a timing replay's hook (stepped runners only).

    Returns:
        ``(runners, absent)``: the runners, and ``{backend: why}`` for those not available here (never timed).

    Raises:
        ValueError: an unknown backend name (one line listing them).
    """
    decoders = list(decoders.values()) if isinstance(decoders, Mapping) else list(decoders)
    precision, device = precision_of(code_predictor), next(code_predictor.parameters()).device.type
    runners, absent = [], {}
    for name in backends:
        ok, why = available(name, precision, device)
        if not ok:
            absent[name] = why
            continue
        verify = verify_backend(name, code_predictor)
        runners += [frame_runner(name, code_predictor, d, sampling=sampling, acceptance=acceptance, verify=verify)
                    for d in decoders]
        if fused and acceptance is None:
            runners += [frame_runner(name, code_predictor, d, fused=True, sampling=sampling, verify=verify)
                        for d in decoders if fused_support(name, getattr(d, "decoder", d), sampling) is None]
    return runners, absent


# ----------------------------------------------------------------------------------------------------------------
# Frame times
# ----------------------------------------------------------------------------------------------------------------
def time_frames(runners: Sequence, contexts: torch.Tensor, *, repeats: int = 20, warmup: int = 2, seed: int = 0,
                noise_target: float | None = None, max_repeats: int | None = None, progress: bool = True,
                random_weights: bool | None = None) -> dict:
    """Time one frame (batch 1) of every runner, interleaved; fused runners' graphs are built first
    (``meta["prepare_s"]``).

    Args:
        runners: frame runners over ONE code predictor; put AR in (stepped, and fused) to get the speedups.
        contexts: ``(N, 2, talker_hidden)``; round r decodes context ``r mod N`` with generator seed ``seed + r``.
        repeats, warmup, noise_target, max_repeats, progress: :func:`rvqspec_lib.eval.timing.interleaved`'s.
            random_weights: recorded in ``meta``.

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per runner: its fields (``decoder``, ``kind``, ``drafter``,
        ``nodes``, ``lossy``, ``backend``, ``fused``, ``precision``), ``tokens_per_call`` (mean over the first
        ``repeats`` frames, prefill included), ``calls_per_frame``, ``ms_per_frame`` (median), ``p10_ms``, ``p90_ms``,
        ``model_ms`` (in the backend's forward), ``heads_ms`` (heads, embeddings, drafts), ``outside_ms`` (the loop
        outside the model), ``outside_share``, ``speedup_vs_ar`` and ``speedup_vs_fused`` (over stepped AR and the
        fused AR frame of the same backend and precision, ratios of medians).

    Raises:
        ValueError: bad contexts, no runner, two runners with the same fields, bad settings (one line each).
    """
    cp, contexts = _frame_inputs(runners, contexts)
    fields = [runner_fields(r) for r in runners]
    keys = [tuple(sorted(f.items())) for f in fields]
    if len(set(keys)) != len(keys):
        raise ValueError("two runners have the same decoder, backend, precision and fusion: time each once")
    prepare_s = {f"{f['decoder']}/{f['backend']}": round(r.prepare(1), 1)
                 for f, r in zip(fields, runners) if r.fused}
    clocks = [Clock() for _ in runners]
    timed = [_timed(r, c) for r, c in zip(runners, clocks)]
    n_ctx, dev = contexts.shape[0], contexts.device

    def condition(i: int):
        def run(r_idx: int):
            clocks[i].reset()
            res = timed[i](contexts[r_idx % n_ctx: r_idx % n_ctx + 1], _generator(dev, seed + r_idx))
            return (float(res.tokens_per_call.mean()), float(res.calls.float().mean()), clocks[i].model_s,
                    clocks[i].heads_s)
        return run

    t = interleaved({i: condition(i) for i in range(len(runners))}, repeats=repeats, warmup=warmup,
                    noise_target=noise_target, max_repeats=max_repeats, seed=seed, sync=device_sync(dev),
                    progress=progress, desc="frames", module=cp, random_weights=random_weights)
    rows = []
    for i, (f, r) in enumerate(zip(fields, runners)):
        frame, out = t.ms[i], t.out[i]
        model = [o[2] * 1e3 if not r.fused else ms for o, ms in zip(out, frame)]
        heads = [o[3] * 1e3 for o in out]
        outside = [fr - m - h for fr, m, h in zip(frame, model, heads)]
        s = summary(frame)
        # tokens per call over the first `repeats` rounds, which every run makes: the same whatever the noise target
        # added (docs/reproducibility.md)
        rows.append({**f, "tokens_per_call": statistics.fmean(o[0] for o in out[:repeats]),
                     "calls_per_frame": statistics.fmean(o[1] for o in out[:repeats]), "ms_per_frame": s["median_ms"],
                     "p10_ms": s["p10_ms"], "p90_ms": s["p90_ms"], "model_ms": statistics.median(model),
                     "heads_ms": statistics.median(heads), "outside_ms": statistics.median(outside),
                     "outside_share": statistics.median([o / fr for o, fr in zip(outside, frame)])})
    _speedups(rows)
    meta = {**t.meta, "n_contexts": int(n_ctx), "prepare_s": prepare_s,
            "noise_keys": {str(i): f"{f['decoder']}/{f['backend']}{'/fused' if f['fused'] else ''}"
                           for i, f in enumerate(fields)}}
    return {"rows": rows, "meta": meta}


def _speedups(rows: list[dict]) -> None:
    """``speedup_vs_ar`` (stepped AR) and ``speedup_vs_fused`` (fused AR) of the same backend and precision, in
    place."""
    def ar(fused):
        return {(r["backend"], r["precision"], r.get("batch")): r["ms_per_frame"] for r in rows
                if r["kind"] == "ar" and bool(r["fused"]) == fused}
    stepped, fused = ar(False), ar(True)
    for r in rows:
        k = (r["backend"], r["precision"], r.get("batch"))
        r["speedup_vs_ar"] = stepped[k] / r["ms_per_frame"] if k in stepped else None
        r["speedup_vs_fused"] = fused[k] / r["ms_per_frame"] if k in fused else None


# ----------------------------------------------------------------------------------------------------------------
# Verify cost curve
# ----------------------------------------------------------------------------------------------------------------
def verify_call(code_predictor, backend, q: int, prefix_len: int = PREFIX_LEN, seed: int = 0, *,
                whole: bool = False):
    """One verify call of ``q`` query positions after ``prefix_len`` committed slots, as a closure ``call(round)``
    (every call rewrites the same ``q`` slots).

    Args:
        backend: a verify backend. q, prefix_len: >= 1. seed: of the random inputs.
        whole: False: the backend's ``forward`` alone (the cost curve); True: the call as a decode round makes it,
            projection first and one head's logits after (the benchmarks' latency grid).

    Returns:
        ``call(round) -> (1, q, hidden)`` hidden states, or ``(q, codebook_size)`` logits with ``whole``.
    """
    g = torch.Generator().manual_seed(seed)
    p0 = next(code_predictor.parameters())
    width = P.talker_hidden_size(code_predictor) if whole else int(code_predictor.config.hidden_size)
    project = code_predictor.small_to_mtp_projection if whole else (lambda x: x)
    slots = prefix_len + q
    cache = backend.new_cache(1, slots)
    slot = torch.arange(slots, device=p0.device)
    with torch.inference_mode():
        pre = torch.randn(1, prefix_len, width, generator=g).to(p0)
        idx = slot[None, :prefix_len]
        backend.forward(project(pre), idx, (slot[None, None, :] <= slot[None, :prefix_len, None]), cache, idx)
    x = torch.randn(1, q, width, generator=g).to(p0)
    idx = slot[None, prefix_len:]
    allow = slot[None, None, :] <= slot[None, prefix_len:, None]  # (1, Q, S): the prefix and a causal block
    head = torch.zeros(q, dtype=torch.long, device=p0.device)  # lm_head[0] on every position

    def call(_round: int = 0):
        with torch.inference_mode():
            h = backend.forward(project(x), idx, allow, cache, idx)  # (1, Q, hidden)
            return backend.logits(h[0], head) if whole else h
    return call


def verify_cost_curve(code_predictor, backends: Mapping[str, object], *, query_sizes: Sequence[int] = QUERY_SIZES,
                      repeats: int = 20, warmup: int = 3, seed: int = 0, random_weights: bool | None = None,
                      progress: bool = True, noise_target: float | None = None) -> dict:
    """t(Q)/t(1) of one verify call (the backend's ``forward`` alone, after :data:`PREFIX_LEN` committed slots) per
    backend, every (backend, Q) interleaved.

    Args:
        backends: ``{name: verify backend}``. query_sizes: the Qs, 1 among them. Others as
            :func:`rvqspec_lib.eval.timing.interleaved`.

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per (backend, Q): ``backend``, ``query_positions``, ``median_ms``,
        ``p10_ms``, ``p90_ms``, ``ratio_to_q1``.

    Raises:
        ValueError: Q = 1 missing, a Q < 1, bad settings.
    """
    qs = sorted({int(q) for q in query_sizes})
    if 1 not in qs or qs[0] < 1:
        raise ValueError(f"query_sizes must be positive and include 1 (the ratio's reference), got {query_sizes}")
    calls = {(b, q): verify_call(code_predictor, be, q, seed=seed) for b, be in backends.items() for q in qs}
    t = interleaved(calls, repeats=repeats, warmup=warmup, noise_target=noise_target, seed=seed,
                    sync=device_sync(next(code_predictor.parameters()).device), progress=progress, desc="verify cost",
                    module=code_predictor, random_weights=random_weights)
    rows = []
    for b in backends:
        base = statistics.median(t.ms[(b, 1)])
        for q in qs:
            s = t.summary((b, q))
            rows.append({"backend": b, "query_positions": q, "median_ms": s["median_ms"], "p10_ms": s["p10_ms"],
                         "p90_ms": s["p90_ms"], "ratio_to_q1": s["median_ms"] / base})
    return {"rows": rows, "meta": {**t.meta, "prefix_len": PREFIX_LEN}}
