"""The talker step timed per precision, official and native, against its weight-streaming floor, in ONE interleaved
run (docs/precision.md#the-native-talker); :func:`scan_cost`: what attending over the filled prefix of the native
cache saves. Real-size architectures have random weights here: timing only."""

from __future__ import annotations

import copy
import statistics
from typing import Sequence

import torch
from torch import nn
from transformers import DynamicCache

from bench.floor import floor_ms, talker_step_bytes
from rvqspec_lib.eval.timing import bandwidth_around, interleaved, load_words, machine_lines, summary
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.device.precision import PRECISIONS, apply_precision, cpu_features, native_precisions, precision_of

#: Contexts timed by default (positions already in the KV cache when the step runs).
DEFAULT_CONTEXTS = (64, 512)
#: The forwards a talker step can run through.
TALKER_FORWARDS = ("official", "native")
#: Scale of the random input embeddings (the size of real talker inputs).
EMBED_SCALE = 0.02


def slim_talker(talker):
    """A deep copy of ``lm.model.talker`` holding what a step runs (``model``, ``codec_head``); the code predictor,
    the text table and ``text_projection`` become empty stand-ins, so that a benchmark can hold one copy per
    precision."""
    memo = {id(talker.code_predictor): nn.Identity(), id(talker.text_projection): nn.Identity(),
            id(talker.model.text_embedding): nn.Embedding(1, 1)}
    return copy.deepcopy(talker, memo)


def talker_inputs(hidden: int, context: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random float32 inputs of a timed talker step (timing only): ``context`` cached positions ``(1, C, H)`` and the
    new one ``(1, 1, H)``.

    Raises:
        ValueError: ``context < 1``.
    """
    if context < 1:
        raise ValueError(f"talker_context must be >= 1, got {context}")
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, context, hidden, generator=gen) * EMBED_SCALE,
            torch.randn(1, 1, hidden, generator=gen) * EMBED_SCALE)


def official_step(talker, context: int, *, seed: int = 0):
    """One official talker step (``talker.model`` + ``codec_head``) after ``context`` cached positions of
    :func:`talker_inputs`.

    Returns:
        ``(call, reset)``: ``call(round=0) -> (1, vocab)`` logits; ``reset()`` crops the cache back (outside the
        clock).

    Raises:
        ValueError: ``context < 1``.
    """
    p0 = next(talker.model.norm.parameters())
    ctx, step = (x.to(p0) for x in talker_inputs(int(talker.config.hidden_size), context, seed))
    cache, dev = DynamicCache(), p0.device
    pos_step = torch.full((3, 1, 1), context, dtype=torch.long, device=dev)  # (3, 1, 1)
    mask = torch.ones(1, context + 1, dtype=torch.long, device=dev)  # (1, C + 1)
    with torch.inference_mode():
        talker.model(inputs_embeds=ctx, past_key_values=cache, use_cache=True, attention_mask=mask[:, :context],
                     position_ids=torch.arange(context, device=dev).view(1, 1, -1).expand(3, 1, -1))

    def call(_round: int = 0):
        with torch.inference_mode():
            h = talker.model(inputs_embeds=step, past_key_values=cache, use_cache=True, attention_mask=mask,
                             position_ids=pos_step).last_hidden_state
            return talker.codec_head(h[:, -1])  # (1, vocab)

    return call, lambda: cache.crop(context)


def native_step(nt, context: int, *, seed: int = 0):
    """:func:`official_step` through a :class:`~rvqspec_lib.device.native_talker.NativeTalker` (its own cache of
    ``context + 1`` slots).

    Raises:
        ValueError: ``context < 1``.
    """
    ctx, step = (x.to(nt.dtype) for x in talker_inputs(nt.hidden, context, seed))
    cache = nt.new_cache(1, context + 1)
    nt.use_cache(cache)
    with torch.inference_mode():
        nt.extend(ctx)

    def call(_round: int = 0):
        with torch.inference_mode():
            nt.use_cache(cache)
            return nt.logits(nt.step(step)[:, -1])  # (1, vocab)

    return call, lambda: cache.crop(context)


def _timed(conditions: list, warmup: int, repeats: int, progress: bool) -> tuple[dict, dict]:
    """Every ``(key, call, reset)`` interleaved: ``({key: summary + cpu_ms}, meta)``."""
    with torch.inference_mode():
        t = interleaved({k: call for k, call, _ in conditions}, repeats=repeats, warmup=warmup,
                        reset={k: reset for k, _, reset in conditions}, progress=progress, desc="talker rounds")
    return {k: {**summary(t.ms[k]), "cpu_ms": statistics.median(t.cpu_ms[k])} for k in t.ms}, t.meta


def bench_talker_precisions(talker, precisions: Sequence[str] | None = None, *,
                            contexts: Sequence[int] = DEFAULT_CONTEXTS,
                            forwards: Sequence[str] = TALKER_FORWARDS, warmup: int = 3, repeats: int = 15,
                            seed: int = 0, bandwidth: dict | None = None, progress: bool = False,
                            model_name: str = "", random_weights: bool = True) -> dict:
    """Talker steps per (precision, forward, context), one interleaved run, each against its floor.

    Args:
        talker: the official talker in float32 (not modified). precisions: default the CPU's native ones. contexts:
            cached positions before the step (each >= 1). forwards: some of :data:`TALKER_FORWARDS`. warmup, repeats,
            seed: of the timing and inputs.
        bandwidth: a :func:`rvqspec_lib.eval.timing.read_bandwidth` result; ``None``: read around the timing.
            model_name, random_weights: reported as given.

    Returns:
        JSON-able dict: the timing's meta, ``model``, ``random_weights``, ``device_name``, ``cpu_flags``,
        ``native_precisions``, ``bandwidth``, the settings, and ``rows`` per (precision, context, forward): the
        summary, ``cpu_ms`` (thread CPU time), ``weight_bytes``, ``kv_bytes`` (in that forward's cache dtype),
        ``packed_bytes`` (native), ``floor_ms``, ``floor_kv_ms``, ``over_floor``, ``over_floor_kv``, ``floor_cpu_ms``,
        ``cpu_over_floor``, ``cpu_over_floor_kv`` (the CPU-time ones ``None`` without ``gb_per_s_cpu``).

    Raises:
        ValueError: an unknown precision or forward, a context < 1, a talker not in float32.
    """
    precisions = list(native_precisions() if precisions is None else precisions)
    forwards, contexts = list(forwards), [int(c) for c in contexts]
    if not precisions or any(p not in PRECISIONS for p in precisions):
        raise ValueError(f"precisions must be some of {', '.join(PRECISIONS)}, got {precisions}")
    if not forwards or any(f not in TALKER_FORWARDS for f in forwards):
        raise ValueError(f"forwards must be some of {', '.join(TALKER_FORWARDS)}, got {forwards}")
    if not contexts or min(contexts) < 1:
        raise ValueError(f"contexts must be positive, got {contexts}")
    if precision_of(talker.model) != "float32":
        raise ValueError(f"bench_talker_precisions takes the talker in float32, got {precision_of(talker.model)}")
    talkers = {p: talker if p == "float32" else apply_precision(copy.deepcopy(talker), p, require_native=False)
               for p in precisions}
    conditions, weights, natives = [], {}, {}  # in the rows' order: precision, context, forward
    for p in precisions:
        weights[p] = talker_step_bytes(talkers[p])
        if "native" in forwards:
            natives[p] = NativeTalker(talkers[p], max_context=max(contexts) + 1)
        conditions += [((p, f, c), *(official_step(talkers[p], c, seed=seed + c) if f == "official" else
                                      native_step(natives[p], c, seed=seed + c))) for c in contexts for f in forwards]

    def measure():
        return _timed(conditions, warmup, repeats, progress)

    (stats, meta), bandwidth = bandwidth_around(measure) if bandwidth is None else (measure(), bandwidth)
    gbs, gbs_cpu = bandwidth["gb_per_s"], bandwidth.get("gb_per_s_cpu")
    rows = []
    for (p, f, c), st in stats.items():
        wb = weights[p]["bytes"]
        kv_elem = natives[p].kv_dtype.itemsize if f == "native" else None  # None: the official cache's dtype
        kv = talker_step_bytes(talkers[p], context=c, kv_element_bytes=kv_elem)["kv_bytes"]
        fl, fl_kv = floor_ms(wb, gbs), floor_ms(wb + kv, gbs)
        fl_cpu, fl_kv_cpu = (floor_ms(wb, gbs_cpu), floor_ms(wb + kv, gbs_cpu)) if gbs_cpu else (None, None)
        rows.append({"precision": p, "forward": f, "context": c, **st, "weight_bytes": wb, "kv_bytes": kv,
                     "packed_bytes": natives[p].weight_bytes if f == "native" else None,
                     "floor_ms": fl, "floor_kv_ms": fl_kv, "over_floor": st["median_ms"] / fl,
                     "over_floor_kv": st["median_ms"] / fl_kv, "floor_cpu_ms": fl_cpu,
                     "cpu_over_floor": st["cpu_ms"] / fl_cpu if fl_cpu else None,
                     "cpu_over_floor_kv": st["cpu_ms"] / fl_kv_cpu if fl_kv_cpu else None})
    return {**meta, "model": model_name, "random_weights": bool(random_weights), "device_name": meta["cpu"],
            "cpu_flags": cpu_features(), "native_precisions": list(native_precisions()), "bandwidth": bandwidth,
            "contexts": contexts, "forwards": forwards,
            "precisions": precisions, "warmup": warmup, "repeats": repeats, "seed": seed, "interleaved": True,
            "rows": rows}


def scan_cost(nt, *, context: int = 64, capacity: int = 2048, warmup: int = 3, repeats: int = 15,
              seed: int = 0) -> dict:
    """The native step after ``context`` positions in a cache of ``capacity`` slots, scanning the prefix (default)
    against every slot through a mask (bit-identical, tested), interleaved; ``nt``'s cache is replaced.

    Returns:
        ``{"context", "capacity", "prefix_ms", "whole_cache_ms", "saved_ms"}`` (wall-clock medians) and
        ``prefix_cpu_ms``, ... in thread CPU time.

    Raises:
        ValueError: a context outside 1..capacity - 1.
    """
    if not 1 <= context < capacity:
        raise ValueError(f"need 1 <= context < capacity, got context={context}, capacity={capacity}")
    ctx, step = (x.to(nt.dtype) for x in talker_inputs(nt.hidden, context, seed))
    nt.reset(1, max_context=capacity)
    with torch.inference_mode():
        nt.extend(ctx)

    def run(whole: bool):
        def call(_i):
            nt.scan_whole_cache = whole
            try:
                nt.step(step)
            finally:
                nt.scan_whole_cache = False
        return call

    st, _ = _timed([("prefix", run(False), lambda: nt.crop(context)),
                    ("whole", run(True), lambda: nt.crop(context))], warmup, repeats, False)
    return {"context": context, "capacity": capacity, "prefix_ms": st["prefix"]["median_ms"],
            "whole_cache_ms": st["whole"]["median_ms"],
            "saved_ms": st["whole"]["median_ms"] - st["prefix"]["median_ms"],
            "prefix_cpu_ms": st["prefix"]["cpu_ms"], "whole_cache_cpu_ms": st["whole"]["cpu_ms"],
            "saved_cpu_ms": st["whole"]["cpu_ms"] - st["prefix"]["cpu_ms"]}


def format_talker_table(result: dict) -> str:
    """Plain-text table of a :func:`bench_talker_precisions` result: the CPU, then per row the step, MB read and both
    floors."""
    lines = [
        f"talker step (1 new position + codec_head): model {result['model']}"
        f"{' (RANDOM weights: timing only)' if result['random_weights'] else ''} | threads {result['threads']} | "
        f"interleaved, warmup {result['warmup']}, repeats {result['repeats']}" + load_words(result),
        *machine_lines(result, result["cpu_flags"], "floor = weight bytes / bandwidth; floor+kv adds the KV cache the "
                       "step attends; cpu x: the thread's CPU time over the same floors at the CPU-time bandwidth"),
        f"{'precision':<12} {'ctx':>4} {'forward':<8} {'ms':>8} {'p10-p90':>13} {'cpu ms':>7} {'weights MB':>10} "
        f"{'kv MB':>6} {'floor ms':>8} {'x floor':>7} {'floor+kv':>8} {'x fl+kv':>7} {'cpu x fl':>8} "
        f"{'cpu x fl+kv':>11}",
    ]
    for r in result["rows"]:
        lines.append(f"{r['precision']:<12} {r['context']:>4} {r['forward']:<8} {r['median_ms']:>8.2f} "
                     f"{r['p10_ms']:>6.1f}-{r['p90_ms']:<6.1f} {r['cpu_ms']:>7.2f} {r['weight_bytes'] / 1e6:>10.1f} "
                     f"{r['kv_bytes'] / 1e6:>6.1f} {r['floor_ms']:>8.2f} {r['over_floor']:>7.2f} "
                     f"{r['floor_kv_ms']:>8.2f} {r['over_floor_kv']:>7.2f} "
                     f"{'' if r['cpu_over_floor'] is None else format(r['cpu_over_floor'], '.2f'):>8} "
                     f"{'' if r['cpu_over_floor_kv'] is None else format(r['cpu_over_floor_kv'], '.2f'):>11}")
    return "\n".join(lines)
