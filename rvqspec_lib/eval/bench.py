"""Latency of the two loops of Qwen3-TTS, and the call budget derived from the config.

Qwen3-TTS runs two nested autoregressive loops (docs/model.md#two-nested-loops): the talker makes one call per frame
(``frame_rate_hz`` = 12.5) and emits code 0; the code predictor then makes ``n_code_groups - 1`` = 15 sequential
calls, one per code 1..15. Real time therefore needs ``frame_rate_hz * n_code_groups`` = 200 model calls a second.
Speculative decoding replaces several inner-loop calls by one verify call over ``Q`` query positions, so what matters
is how the cost of one call grows with ``Q`` (the "verify cost curve" ``t(Q) / t(1)``) on the target device.

What is timed (:func:`bench_model`):

* talker step: ``talker.model`` on ONE new position after a KV prefix of ``talker_context`` positions
  (MRoPE position ids of shape ``(3, 1, 1)``), then ``codec_head`` -> ``(1, 3072)`` logits;
* code-predictor call: ``small_to_mtp_projection`` + ``code_predictor.model`` on ``Q`` query positions after a
  KV prefix of ``prefix_len`` positions, then one ``lm_head`` on all ``Q`` positions -> ``(1, Q, 2048)`` logits.
  A verify call of a real decoder applies a different head per depth; the matmul cost is the same.

The KV cache is built once and cropped back (``DynamicCache.crop``) after each timed call, outside the timer.
Timing depends on the architecture, not on the weights: the real-size random models give real latencies but their
outputs mean nothing (``random_weights`` is reported beside every figure).

Method (docs/style.md#benchmarks, after gpt-fast): warm up, synchronise the device before reading the clock, report the median and
the 10th/90th percentiles, and print device, dtype and thread count beside every number.

:func:`bench_precisions` times the code-predictor call in several precisions (float32, bfloat16, int8;
:mod:`rvqspec_lib.models.precision`) interleaved, each against its weight-streaming floor
(:mod:`rvqspec_lib.eval.floor`; docs/precision.md).

The command line (``rvqspec bench``: options, printing, the JSON file) is :mod:`rvqspec_lib.cli.bench`. torch is
imported inside the timing functions only, so reading this module's constants (the command's help) stays fast.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from rvqspec_lib.common.progress import progress_bar

if TYPE_CHECKING:
    import torch

#: Query sizes timed by default: powers of two up to 64 (a 16-position frame never needs more than 15 nodes per call
#: in a chain, but trees of 32-64 nodes are the interesting trade-off on fast devices).
DEFAULT_QUERY_SIZES = (1, 2, 4, 8, 16, 32, 64)
#: Tokens-per-call values tabulated by default; 2.47 is the paper's reported value.
DEFAULT_TOKENS_PER_CALL = (1.0, 1.5, 2.0, 2.47, 3.0)
PAPER_TOKENS_PER_CALL = 2.47


# ----------------------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------------------
def _sync_for(device: torch.device) -> Callable[[], None] | None:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return None


def time_call(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 20,
              reset: Callable[[], None] | None = None, sync: Callable[[], None] | None = None,
              noise_target: float | None = None, max_repeats: int | None = None) -> dict:
    """Wall-clock latency of ``fn()`` under ``torch.inference_mode``.

    Args:
        fn: the call to time (its result is discarded).
        warmup: untimed calls first (allocator, kernels, caches).
        repeats: timed calls (``>= 1``; with ``noise_target`` the minimum, ``>= 2``).
        noise_target, max_repeats: None (exactly ``repeats`` calls), or go on timing until the median's relative
            standard error is <= ``noise_target`` or ``max_repeats`` calls (default 4 x ``repeats``)
            (:func:`rvqspec_lib.eval.noise.should_stop`).
        reset: called after every call (warm-up included), OUTSIDE the timer, e.g. to crop a KV cache back.
        sync: device synchronisation (e.g. ``torch.cuda.synchronize``), called before starting and before stopping
            the clock, so that asynchronous devices are timed correctly. ``None`` on CPU.

    Returns:
        ``{"median_ms", "p10_ms", "p90_ms", "min_ms", "mean_ms", "n", "rel_se"}``: milliseconds per call over the
        ``n`` timed calls (warm-up excluded; ``n = repeats`` without a target); ``rel_se`` the median's achieved
        relative standard error (:func:`rvqspec_lib.eval.noise.relative_standard_error`, None under 2 calls).
        Percentiles interpolate linearly between order statistics.

    Raises:
        ValueError: ``repeats < 1`` or ``warmup < 0``, bad noise settings (:func:`rvqspec_lib.eval.noise.repeat_cap`).
    """
    import torch

    from rvqspec_lib.eval import noise

    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    cap = noise.repeat_cap(noise_target, repeats, max_repeats)
    times_ms: list[float] = []
    with torch.inference_mode():
        for i in range(warmup + cap):
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            dt = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                times_ms.append(dt)
            if reset is not None:
                reset()
            if i >= warmup and noise.should_stop({"call": times_ms}, noise_target, repeats, cap):
                break
    return {
        "median_ms": statistics.median(times_ms),
        "p10_ms": _percentile(times_ms, 10),
        "p90_ms": _percentile(times_ms, 90),
        "min_ms": min(times_ms),
        "mean_ms": statistics.fmean(times_ms),
        "n": len(times_ms),
        "rel_se": noise.noise_meta({"call": times_ms}, noise_target, cap)["rel_se"]["call"],
    }


def _percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _cpu_snapshot() -> tuple[float, float, float] | None:
    """(busy CPU seconds of the whole machine, wall CPU seconds of all cores, CPU seconds of this process), from
    ``/proc/stat`` and ``os.times``; ``None`` where ``/proc/stat`` is missing (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    t = os.times()
    return (total - idle) / tick, total / tick, t.user + t.system


#: Share of the machine's CPU time other processes may use during a CPU timing before it counts as oversubscribed
#: (docs/style.md#benchmarks). Above it the committed 01 run (other processes at 63%, one torch thread on two cores)
#: timed t(2)/t(1) above t(4)/t(1): even a thread that keeps its core loses cache and memory bandwidth to the others.
OTHER_CPU_LIMIT = 0.2


def cpu_oversubscribed(result: dict) -> bool | None:
    """True when, during a CPU benchmark, other processes used more than :data:`OTHER_CPU_LIMIT` of the machine's CPU
    time, or they and the benchmark's threads wanted more cores than exist
    (``other_cpu_frac * cpu_count + threads > cpu_count + 0.1``: torch's threads were descheduled, even by niced
    processes, since Linux autogroups scope ``nice`` to a session). Then the times are pessimistic, often several-fold.

    Args:
        result: a dict with ``other_cpu_frac``, and ``device`` / ``cpu_count`` / ``threads`` where known (a
            :func:`bench_model` result, or the ``meta`` of an ``rvqspec_lib.eval.speed`` timing).

    Returns:
        ``None`` when unknown (not Linux) or not a CPU benchmark, else the verdict.
    """
    other, n_cpu = result.get("other_cpu_frac"), result.get("cpu_count")
    if str(result.get("device", "cpu")) != "cpu" or other is None:
        return None
    crowded = bool(n_cpu) and other * n_cpu + int(result.get("threads") or 1) > n_cpu + 0.1
    return bool(other > OTHER_CPU_LIMIT or crowded)


def oversubscribed_note(result: dict) -> str:
    """``"OVERSUBSCRIBED: other processes used X% of the CPU"`` when :func:`cpu_oversubscribed`, else ``""``: the
    words a timing figure's title and a timing table's caption carry (docs/style.md#benchmarks)."""
    if not cpu_oversubscribed(result):
        return ""
    return f"OVERSUBSCRIBED: other processes used {100 * result['other_cpu_frac']:.0f}% of the CPU"


def measure_quietly(measure, *, meta=lambda r: r, attempts: int = 2):
    """Run a timing, and once more if the CPU was oversubscribed during it; keep the quieter run.

    Args:
        measure: a callable with no arguments that times something and returns its result.
        meta: picks from that result the dict :func:`cpu_oversubscribed` reads (``other_cpu_frac``, ``device``,
            ``cpu_count``, ``threads``); e.g. ``lambda r: r["meta"]`` for ``rvqspec_lib.eval.speed`` results.
        attempts: timings at most (2: measure, and re-measure once).

    Returns:
        ``(result, info)``: the run with the lower ``other_cpu_frac`` (the last one when unknown) and
        ``{"attempts": [other_cpu_frac of each run], "oversubscribed": bool | None, "note": oversubscribed_note}``
        for that run. A note that is not empty goes into the figure's title and the table's caption.
    """
    runs = []
    for _ in range(max(1, int(attempts))):
        r = measure()
        runs.append(r)
        if not cpu_oversubscribed(meta(r)):
            break
    best = min(runs, key=lambda r: (meta(r).get("other_cpu_frac") is None, meta(r).get("other_cpu_frac") or 0.0))
    info = {"attempts": [meta(r).get("other_cpu_frac") for r in runs], "oversubscribed": cpu_oversubscribed(meta(best)),
            "note": oversubscribed_note(meta(best))}
    return best, info


def other_cpu_fraction(before, after) -> float | None:
    """Share of the machine's CPU time used by OTHER processes between two :func:`_cpu_snapshot` calls (0..1).

    Near 0: the timing had the cores to itself. Clearly above 0 on a CPU benchmark: other processes (even niced ones)
    competed for the cores and multi-threaded timings are pessimistic, sometimes several-fold.
    """
    if before is None or after is None or after[1] <= before[1]:
        return None
    busy, total, own = (a - b for a, b in zip(after, before))
    return max(0.0, min(1.0, (busy - own) / total))


# ----------------------------------------------------------------------------------------------------------------------
# Model calls
# ----------------------------------------------------------------------------------------------------------------------
def _model_device_dtype(module: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(module.parameters())
    return p.device, p.dtype




def bench_talker_step(loaded, *, talker_context: int = 64, warmup: int = 3, repeats: int = 20, seed: int = 0,
                      noise_target: float | None = None, max_repeats: int | None = None) -> dict:
    """Time one talker step: one new position after a KV prefix of ``talker_context`` positions, plus ``codec_head``.

    Inputs are random embeddings ``(1, L, talker_hidden)`` from a seeded ``torch.Generator`` (timing only).
    The MRoPE position ids have shape ``(3, 1, L)`` with the same ids on all three axes, as for speech positions.

    Returns:
        :func:`time_call` statistics plus ``"talker_context"``.
    """
    import torch

    talker = loaded.talker
    device, dtype = _model_device_dtype(talker)
    hidden = int(talker.config.hidden_size)
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    ctx = (torch.randn(1, talker_context, hidden, generator=gen) * 0.02).to(device, dtype)  # (1, C, H)
    step = (torch.randn(1, 1, hidden, generator=gen) * 0.02).to(device, dtype)  # (1, 1, H)
    cache = DynamicCache()
    pos_ctx = torch.arange(talker_context, device=device).view(1, 1, -1).expand(3, 1, -1)  # (3, 1, C)
    pos_step = torch.full((3, 1, 1), talker_context, dtype=torch.long, device=device)  # (3, 1, 1)
    mask = torch.ones(1, talker_context + 1, dtype=torch.long, device=device)  # (1, C + 1)
    with torch.inference_mode():
        talker.model(inputs_embeds=ctx, past_key_values=cache, use_cache=True,
                     attention_mask=mask[:, :talker_context], position_ids=pos_ctx)

    def call():
        out = talker.model(inputs_embeds=step, past_key_values=cache, use_cache=True,
                           attention_mask=mask, position_ids=pos_step)
        return talker.codec_head(out.last_hidden_state[:, -1])  # (1, vocab)

    stats = time_call(call, warmup=warmup, repeats=repeats, reset=lambda: cache.crop(talker_context),
                      sync=_sync_for(device), noise_target=noise_target, max_repeats=max_repeats)
    return {**stats, "talker_context": talker_context}


def _code_predictor_calls(cp, in_hidden: int, prefix_len: int, query_sizes: Sequence[int], seed: int) -> list:
    """``[(Q, call, reset)]``: the timed call of :func:`bench_code_predictor` for each ``Q`` over one KV prefix of
    ``prefix_len`` positions (random inputs ``(1, Q, in_hidden)`` from a generator seeded ``seed``, in the module's
    dtype); ``reset`` crops the cache back to the prefix."""
    import torch
    from transformers import DynamicCache

    device, dtype = _model_device_dtype(cp)
    gen = torch.Generator().manual_seed(seed)
    prefix = (torch.randn(1, prefix_len, in_hidden, generator=gen) * 0.02).to(device, dtype)  # (1, P, Ht)
    cache = DynamicCache()
    with torch.inference_mode():
        cp.model(inputs_embeds=cp.small_to_mtp_projection(prefix), past_key_values=cache, use_cache=True,
                 position_ids=torch.arange(prefix_len, device=device).unsqueeze(0))
    out = []
    for q in query_sizes:
        x = (torch.randn(1, q, in_hidden, generator=gen) * 0.02).to(device, dtype)  # (1, Q, Ht)
        pos = torch.arange(prefix_len, prefix_len + q, device=device).unsqueeze(0)  # (1, Q)

        def call(x=x, pos=pos):
            h = cp.model(inputs_embeds=cp.small_to_mtp_projection(x), past_key_values=cache, use_cache=True,
                         position_ids=pos).last_hidden_state  # (1, Q, Hc)
            return cp.lm_head[0](h)  # (1, Q, codebook_size)

        out.append((q, call, lambda: cache.crop(prefix_len)))
    return out


def _native_calls(cp, in_hidden: int, prefix_len: int, query_sizes: Sequence[int], seed: int) -> list:
    """As :func:`_code_predictor_calls`, through the native forward (:class:`rvqspec_lib.models.native.
    NativeCodePredictor`): the same inputs, a slot cache of ``prefix_len + max(Q)`` slots holding the prefix, each
    call writing its Q positions after it (nothing to reset: the next call overwrites them)."""
    import torch

    from rvqspec_lib.models.native import NativeCodePredictor

    nat = NativeCodePredictor(cp)
    gen = torch.Generator().manual_seed(seed)
    dtype = next(cp.parameters()).dtype
    slots = prefix_len + max(query_sizes)
    causal = torch.ones(slots, slots, dtype=torch.bool).tril()
    prefix = (torch.randn(1, prefix_len, in_hidden, generator=gen) * 0.02).to(dtype)
    cache = nat.new_cache(1, slots)
    pos0 = torch.arange(prefix_len)[None]
    with torch.inference_mode():
        nat.forward(cp.small_to_mtp_projection(prefix), pos0, causal[None, :prefix_len], cache, pos0)
    out = []
    for q in query_sizes:
        x = (torch.randn(1, q, in_hidden, generator=gen) * 0.02).to(dtype)
        pos = torch.arange(prefix_len, prefix_len + q)[None]
        allow = causal[None, prefix_len:prefix_len + q]
        head = torch.zeros(q, dtype=torch.long)

        def call(x=x, pos=pos, allow=allow, head=head):
            h = nat.forward(cp.small_to_mtp_projection(x), pos, allow, cache, pos)  # (1, Q, Hc)
            return nat.logits(h[0], head)  # (Q, codebook_size)

        out.append((q, call, lambda: None))
    return out


#: The forwards :func:`bench_precisions` times: the official module's call and the native forward's.
FORWARDS = ("official", "native")


def bench_code_predictor(loaded, *, prefix_len: int = 8, query_sizes: Iterable[int] = DEFAULT_QUERY_SIZES,
                         warmup: int = 3, repeats: int = 20, seed: int = 0, progress: bool = True,
                         on_row: Callable[[dict], None] | None = None, noise_target: float | None = None,
                         max_repeats: int | None = None) -> list[dict]:
    """Time one code-predictor call with ``Q`` query positions after a KV prefix of ``prefix_len`` positions.

    Each call: ``small_to_mtp_projection`` of ``(1, Q, talker_hidden)`` random embeddings -> ``code_predictor.model``
    (causal mask, 1-D positions ``prefix_len .. prefix_len + Q - 1``) -> ``lm_head[0]`` on all ``Q`` positions,
    giving ``(1, Q, codebook_size)`` logits. The cache is cropped back to ``prefix_len`` after every call.
    ``prefix_len + Q`` may exceed the 16 positions of a real frame: that is fine for timing.
    ``progress`` shows a tqdm bar over ``query_sizes``; ``on_row(row)`` is called after each ``Q`` is timed.

    Returns:
        one dict per ``Q`` (in the given order): ``{"n_queries": Q, **time_call stats, "ratio_to_1": t(Q) / t(1)}``.
        ``ratio_to_1`` uses medians and is ``None`` when ``1`` is not among ``query_sizes``.

    Raises:
        ValueError: an empty ``query_sizes`` or a ``Q < 1``.
    """
    query_sizes = [int(q) for q in query_sizes]
    if not query_sizes or min(query_sizes) < 1:
        raise ValueError(f"query_sizes must be non-empty positive integers, got {query_sizes}")
    cp = loaded.code_predictor
    device, _ = _model_device_dtype(cp)
    calls = _code_predictor_calls(cp, int(loaded.talker.config.hidden_size), prefix_len, query_sizes, seed)
    rows = []
    for q, call, reset in progress_bar(calls, total=len(calls), desc="code predictor Q", enabled=progress):
        stats = time_call(call, warmup=warmup, repeats=repeats, reset=reset, sync=_sync_for(device),
                          noise_target=noise_target, max_repeats=max_repeats)
        rows.append({"n_queries": q, **stats})
        if on_row is not None:
            on_row(rows[-1])
    base = next((r["median_ms"] for r in rows if r["n_queries"] == 1), None)
    for r in rows:
        r["ratio_to_1"] = r["median_ms"] / base if base else None
    return rows


def bench_model(loaded, *, prefix_len: int = 8, query_sizes: Iterable[int] = DEFAULT_QUERY_SIZES,
                talker_context: int = 64, warmup: int = 3, repeats: int = 20, seed: int = 0,
                progress: bool = True, noise_target: float | None = None, max_repeats: int | None = None) -> dict:
    """Per-call latency of a talker step and of code-predictor calls with ``Q`` queries, plus derived quantities.

    Args:
        loaded: a :class:`rvqspec_lib.models.loader.LoadedModel` (any device / dtype; the model is not modified).
        prefix_len: KV positions already in the code-predictor cache (a realistic mid-frame prefix; at most 16 in use).
        query_sizes: numbers of query positions ``Q`` per code-predictor call.
        talker_context: KV positions already in the talker cache.
        warmup, repeats, noise_target, max_repeats: see :func:`time_call` (each call type stops on its own; its
            ``n`` and ``rel_se`` are in its stats).
        seed: seed of the random input embeddings (the global RNG is not touched).
        progress: show a tqdm progress bar over the calls timed.

    Returns:
        JSON-able dict:
        ``model`` (``loaded.describe()``), ``random_weights`` / ``timing_only`` (True for random models: the times are
        real, the outputs meaningless), ``device``, ``device_name``, ``dtype``, ``threads`` (``torch.get_num_threads()``),
        ``load_avg_1m_before`` / ``load_avg_1m_after`` (1-minute load average around the timing: well above 0 on a
        CPU means other processes competed for the cores and the times are pessimistic), ``other_cpu_frac``
        (share of the machine's CPU time other processes used during the timing, :func:`other_cpu_fraction`),
        ``cpu_count``, ``cpu_oversubscribed`` (:func:`cpu_oversubscribed`: if True the times are pessimistic),
        ``torch``, ``transformers``, the settings, ``talker_step`` (:func:`time_call` stats), ``code_predictor`` (list of
        per-``Q`` rows, see :func:`bench_code_predictor`) and ``derived`` (:func:`derived_from_bench`).
    """
    import torch
    import transformers

    from rvqspec_lib.common.provenance import cpu_model
    from rvqspec_lib.models.precision import precision_of

    device, dtype = _model_device_dtype(loaded.model)
    desc = loaded.describe()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cpu_before = _cpu_snapshot()
    query_sizes = list(query_sizes)
    bar = None
    if progress:
        from tqdm import tqdm  # plain text bar: no ipywidgets needed in notebooks

        bar = tqdm(total=1 + len(query_sizes), desc=f"bench {loaded.name}", unit="call type")
    try:
        talker = bench_talker_step(loaded, talker_context=talker_context, warmup=warmup, repeats=repeats, seed=seed,
                                   noise_target=noise_target, max_repeats=max_repeats)
        if bar is not None:
            bar.update(1)
        cp_rows = bench_code_predictor(loaded, prefix_len=prefix_len, query_sizes=query_sizes, warmup=warmup,
                                       repeats=repeats, seed=seed, progress=False,
                                       on_row=(lambda _r: bar.update(1)) if bar is not None else None,
                                       noise_target=noise_target, max_repeats=max_repeats)
    finally:  # also on Ctrl-C: the bar is finished before the caller reports anything
        if bar is not None:
            bar.close()
    result = {
        "model": desc,
        "random_weights": bool(loaded.is_random),
        "timing_only": bool(loaded.is_random),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "dtype": str(dtype).replace("torch.", ""),
        "code_predictor_precision": precision_of(loaded.code_predictor),
        "threads": torch.get_num_threads(),
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "other_cpu_frac": other_cpu_fraction(cpu_before, _cpu_snapshot()),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "prefix_len": prefix_len,
        "talker_context": talker_context,
        "warmup": warmup,
        "repeats": repeats,
        "noise_target": noise_target,
        "max_repeats": max_repeats,
        "seed": seed,
        "talker_step": talker,
        "code_predictor": cp_rows,
    }
    result["cpu_oversubscribed"] = cpu_oversubscribed(result)
    rel = [r.get("rel_se") for r in (talker, *cp_rows)]
    result["rel_se_max"] = None if None in rel else max(rel)  # the noisiest call's median (noise.noise_meta)
    result["derived"] = derived_from_bench(result, frame_rate_hz=loaded.frame_rate_hz,
                                           n_code_groups=loaded.n_code_groups)
    return result


# ----------------------------------------------------------------------------------------------------------------------
# Derived quantities (from the config, never typed in)
# ----------------------------------------------------------------------------------------------------------------------
def call_budget(frame_rate_hz: float, n_code_groups: int, tokens_per_call: float | None = None) -> dict:
    """Model calls per second needed for real time.

    One frame = 1 talker call (code 0) + ``n_code_groups - 1`` inner-loop codes. Plain AR decoding makes one inner
    call per code; a speculative decoder emitting ``tokens_per_call`` codes per inner call on average (the paper's
    toks/step, the prefill counted as a call) needs ``(n_code_groups - 1) / tokens_per_call`` inner calls.

    Args:
        frame_rate_hz: codec frames per second (12.5 for the 12 Hz models; ``LoadedModel.frame_rate_hz``).
        n_code_groups: codebooks per frame (16; ``LoadedModel.n_code_groups``).
        tokens_per_call: mean inner-loop codes per inner call; ``None`` means plain AR (1.0).

    Returns:
        ``{"frame_rate_hz", "n_code_groups", "tokens_per_call", "inner_calls_per_frame", "calls_per_frame",
        "calls_per_s", "calls_per_s_ar", "reduction"}`` where ``calls_per_s = frame_rate_hz * (1 + (G - 1) / tpc)``
        (200 for 12.5 Hz / 16 groups at tpc 1; 88.4 at tpc 2.47) and ``reduction = calls_per_s_ar / calls_per_s``.

    Raises:
        ValueError: ``frame_rate_hz <= 0``, ``n_code_groups < 2`` or ``tokens_per_call <= 0``.
    """
    tpc = 1.0 if tokens_per_call is None else float(tokens_per_call)
    if frame_rate_hz <= 0 or n_code_groups < 2 or tpc <= 0:
        raise ValueError(f"need frame_rate_hz > 0, n_code_groups >= 2, tokens_per_call > 0; got "
                         f"{frame_rate_hz}, {n_code_groups}, {tokens_per_call}")
    inner = (n_code_groups - 1) / tpc
    ar = frame_rate_hz * n_code_groups
    cps = frame_rate_hz * (1.0 + inner)
    return {
        "frame_rate_hz": float(frame_rate_hz),
        "n_code_groups": int(n_code_groups),
        "tokens_per_call": tpc,
        "inner_calls_per_frame": inner,
        "calls_per_frame": 1.0 + inner,
        "calls_per_s": cps,
        "calls_per_s_ar": ar,
        "reduction": ar / cps,
    }


def budget_table(frame_rate_hz: float, n_code_groups: int,
                 tokens_per_call: Iterable[float] = DEFAULT_TOKENS_PER_CALL) -> list[dict]:
    """:func:`call_budget` for several tokens-per-call values, one row each, with a ``note`` column
    ("plain AR" at 1, "paper's reported value" at :data:`PAPER_TOKENS_PER_CALL`)."""
    rows = []
    for tpc in tokens_per_call:
        b = call_budget(frame_rate_hz, n_code_groups, tpc)
        note = "plain AR" if tpc == 1 else ("paper's reported value" if abs(tpc - PAPER_TOKENS_PER_CALL) < 1e-9 else "")
        rows.append({"tokens_per_call": b["tokens_per_call"], "inner_calls_per_frame": b["inner_calls_per_frame"],
                     "calls_per_s": b["calls_per_s"], "reduction": b["reduction"], "note": note})
    return rows


def inner_share(t_talker_ms: float, t_inner_ms: float, n_inner_calls: float = 15) -> float:
    """Share of a frame's model time spent in the inner loop: ``n * t_inner / (t_talker + n * t_inner)``.

    Args:
        t_talker_ms: one talker step (ms).
        t_inner_ms: one code-predictor call (ms).
        n_inner_calls: inner calls per frame (``n_code_groups - 1`` = 15 for plain AR).

    Raises:
        ValueError: negative times or a zero total.
    """
    if t_talker_ms < 0 or t_inner_ms < 0 or n_inner_calls < 0:
        raise ValueError("times and call counts must be non-negative")
    total = t_talker_ms + n_inner_calls * t_inner_ms
    if total <= 0:
        raise ValueError("total frame time is zero")
    return n_inner_calls * t_inner_ms / total


def derived_from_bench(result: dict, *, frame_rate_hz: float, n_code_groups: int) -> dict:
    """Frame-level quantities from a :func:`bench_model` result (plain AR decoding, one inner call per code).

    Returns:
        ``{"inner_calls_per_frame", "frame_ms_ar", "frame_budget_ms", "rtf_ar", "inner_share_ar",
        "calls_per_s_realtime", "calls_per_s_at_paper_tpc"}``: ``frame_ms_ar = t_talker + (G - 1) * t_cp(1)``,
        ``frame_budget_ms = 1000 / frame_rate_hz`` (80 ms), ``rtf_ar = frame_ms_ar / frame_budget_ms`` (< 1 is faster
        than real time). ``t_cp(1)`` is the Q = 1 median; without a Q = 1 row the smallest Q is used.
    """
    rows = sorted(result["code_predictor"], key=lambda r: r["n_queries"])
    t_inner = rows[0]["median_ms"]
    t_talker = result["talker_step"]["median_ms"]
    n_inner = n_code_groups - 1
    frame_ms = t_talker + n_inner * t_inner
    budget_ms = 1000.0 / frame_rate_hz
    return {
        "inner_calls_per_frame": n_inner,
        "t_talker_ms": t_talker,
        "t_inner_ms": t_inner,
        "frame_ms_ar": frame_ms,
        "frame_budget_ms": budget_ms,
        "rtf_ar": frame_ms / budget_ms,
        "inner_share_ar": inner_share(t_talker, t_inner, n_inner),
        "calls_per_s_realtime": call_budget(frame_rate_hz, n_code_groups)["calls_per_s"],
        "calls_per_s_at_paper_tpc": call_budget(frame_rate_hz, n_code_groups, PAPER_TOKENS_PER_CALL)["calls_per_s"],
    }


def latency_rows(result: dict) -> list[dict]:
    """Flat table of a :func:`bench_model` result: the talker step first, then one row per code-predictor ``Q``.

    Columns: ``call``, ``n_queries``, ``median_ms``, ``p10_ms``, ``p90_ms``, ``min_ms``, ``ratio_to_1``
    (code-predictor rows: ``t(Q) / t_cp(1)``; talker row: ``t_talker / t_cp(1)``), ``n``.
    """
    cp = result["code_predictor"]
    base = next((r["median_ms"] for r in cp if r["n_queries"] == 1), None)
    t = result["talker_step"]
    keys = ("median_ms", "p10_ms", "p90_ms", "min_ms")
    rows = [{"call": f"talker step (ctx {result['talker_context']})", "n_queries": 1, **{k: t[k] for k in keys},
             "ratio_to_1": t["median_ms"] / base if base else None, "n": t["n"]}]
    for r in cp:
        rows.append({"call": f"code predictor (prefix {result['prefix_len']})", "n_queries": r["n_queries"],
                     **{k: r[k] for k in keys}, "ratio_to_1": r["ratio_to_1"], "n": r["n"]})
    return rows


def repeats_words(result: dict) -> str:
    """How many timed calls a :func:`bench_model` result's medians are of, and how noisy they are: ``"repeats 20"``
    with a fixed count, else e.g. ``"repeats 20-47 (noise target 2.0 %, at most 80), median's relative standard
    error <= 1.9 %"``."""
    target, n = result.get("noise_target"), result.get("repeats")
    if target is None:
        return f"repeats {n}"
    made = sorted(r["n"] for r in (result["talker_step"], *result["code_predictor"]))
    span = f"{made[0]}" if made[0] == made[-1] else f"{made[0]}-{made[-1]}"
    worst = result.get("rel_se_max")
    from rvqspec_lib.eval.noise import repeat_cap

    cap = repeat_cap(target, n, result.get("max_repeats"))
    return (f"repeats {span} (noise target {100 * target:.1f} %, at most {cap})"
            + (f", median's relative standard error <= {100 * worst:.1f} %" if worst is not None else ""))


def format_table(result: dict) -> str:
    """Plain-text latency table with the device / dtype / threads header (what ``rvqspec bench`` prints)."""
    m = result["model"]
    head = (f"model {m['name']} ({m['kind']}{', RANDOM weights: timing only' if result['random_weights'] else ''}) | "
            f"device {result['device']} ({result['device_name']}) | dtype {result['dtype']}"
            f"{_cp_precision_note(result)} | "
            f"threads {result['threads']} | torch {result['torch']} | warmup {result['warmup']}, "
            f"{repeats_words(result)}")
    load0, load1 = result.get("load_avg_1m_before"), result.get("load_avg_1m_after")
    if load0 is not None and load1 is not None and result["device"] == "cpu":
        head += f" | load avg {load0:.2f} before, {load1:.2f} after"
    other = result.get("other_cpu_frac")
    if other is not None and result["device"] == "cpu":
        head += f" | other processes used {100 * other:.0f}% of {result.get('cpu_count')} CPUs meanwhile"
        if result.get("cpu_oversubscribed"):
            head += " (OVERSUBSCRIBED, TIMES ARE PESSIMISTIC: rerun idle or with fewer --threads)"
    lines = [head, f"{'call':<30} {'Q':>4} {'median ms':>10} {'p10 ms':>9} {'p90 ms':>9} {'t/t_cp(1)':>10}"]
    for r in latency_rows(result):
        ratio = "" if r["ratio_to_1"] is None else f"{r['ratio_to_1']:.2f}"
        lines.append(f"{r['call']:<30} {r['n_queries']:>4} {r['median_ms']:>10.2f} {r['p10_ms']:>9.2f} "
                     f"{r['p90_ms']:>9.2f} {ratio:>10}")
    d = result["derived"]
    lines.append(f"frame (AR): {d['frame_ms_ar']:.1f} ms of a {d['frame_budget_ms']:.0f} ms budget "
                 f"(RTF {d['rtf_ar']:.2f}); inner-loop share {100 * d['inner_share_ar']:.1f}%; "
                 f"real time needs {d['calls_per_s_realtime']:.0f} calls/s "
                 f"({d['calls_per_s_at_paper_tpc']:.1f} at {PAPER_TOKENS_PER_CALL} tokens/call)")
    return "\n".join(lines)


def _cp_precision_note(result: dict) -> str:
    prec = result.get("code_predictor_precision")
    return "" if prec in (None, result["dtype"]) else f" (code predictor {prec})"


# ----------------------------------------------------------------------------------------------------------------------
# Precisions side by side, against the weight-streaming floor (docs/precision.md)
# ----------------------------------------------------------------------------------------------------------------------
#: Query sizes of the precision table: t(1) and t(Q)/t(1) for these Q.
PRECISION_QUERY_SIZES = (1, 2, 4, 8, 16)


def bench_precisions(loaded, precisions: Sequence[str], *, query_sizes: Iterable[int] = PRECISION_QUERY_SIZES,
                     prefix_len: int = 8, warmup: int = 3, repeats: int = 20, seed: int = 0,
                     bandwidth: dict | None = None, progress: bool = True,
                     forwards: Sequence[str] = ("official",)) -> dict:
    """Code-predictor calls of ``Q`` query positions in several precisions and forwards, timed INTERLEAVED, each
    against its weight-streaming floor (:mod:`rvqspec_lib.eval.floor`).

    ``forwards``: some of :data:`FORWARDS`: ``official`` (the official module's call) and ``native`` (the same call
    through :class:`rvqspec_lib.models.native.NativeCodePredictor`, one C call over packed weights;
    docs/precision.md#the-native-forward). Every (precision, forward, Q) is one condition of the interleaved rounds.

    For each precision a copy of ``loaded.code_predictor`` is converted
    (:func:`rvqspec_lib.models.precision.apply_precision`, without the native check: callers check first); the
    calls are those of :func:`bench_code_predictor`. Every round times one call of every (precision, Q) pair, in an
    order rotated from round to round, so that a change of machine load hits all pairs alike; the first ``warmup``
    rounds are dropped. The floor of a precision is :func:`rvqspec_lib.eval.floor.call_weight_bytes` (one query)
    over the read bandwidth (``bandwidth``, a :func:`rvqspec_lib.eval.floor.read_bandwidth` result; when ``None``
    it is measured before and after the timing and the faster of the two is used, both kept as ``gb_per_s_before``
    and ``gb_per_s_after``).

    Args:
        loaded: a :class:`rvqspec_lib.models.loader.LoadedModel` whose code predictor is in float32 (not modified).
        precisions: names of :data:`rvqspec_lib.models.precision.PRECISIONS`.
        query_sizes: ``Q`` values (1 must be among them for the ratios).
        prefix_len, warmup, repeats, seed: as :func:`bench_code_predictor`.

    Returns:
        JSON-able dict: ``model``, ``random_weights`` / ``timing_only``, ``device_name``, ``cpu_flags``
        (:func:`rvqspec_lib.models.precision.cpu_features`), ``native_precisions``, ``threads``, ``bandwidth``,
        ``other_cpu_frac``, ``cpu_count``, ``cpu_oversubscribed``, ``torch``, the settings, and ``precisions``: one
        dict per (precision, forward), in that order, with ``precision``, ``forward``, ``rows`` (per ``Q``:
        :func:`time_call` statistics and ``ratio_to_1``), ``weight_bytes``
        (:func:`~rvqspec_lib.eval.floor.call_weight_bytes`), ``floor_ms`` and ``t1_over_floor``.

    Raises:
        ValueError: an unknown precision or forward, an empty ``precisions``, a ``Q < 1``.
    """
    import copy

    import torch

    from rvqspec_lib.common.provenance import cpu_model
    from rvqspec_lib.eval.floor import call_weight_bytes, floor_ms, read_bandwidth
    from rvqspec_lib.models.precision import apply_precision, cpu_features, native_precisions

    query_sizes = [int(q) for q in query_sizes]
    if not precisions or not query_sizes or min(query_sizes) < 1:
        raise ValueError(f"need precisions and positive query sizes, got {list(precisions)} and {query_sizes}")
    forwards = list(forwards)
    if not forwards or any(f not in FORWARDS for f in forwards):
        raise ValueError(f"forwards must be some of {', '.join(FORWARDS)}, got {forwards}")
    base = loaded.code_predictor
    device, _ = _model_device_dtype(base)
    in_hidden = int(loaded.talker.config.hidden_size)
    cps = {p: apply_precision(copy.deepcopy(base), p, require_native=False) for p in precisions}
    makers = {"official": _code_predictor_calls, "native": _native_calls}
    keys = [(p, f) for p in precisions for f in forwards]
    pairs = [((p, f), q, call, reset) for p, f in keys
             for q, call, reset in makers[f](cps[p], in_hidden, prefix_len, query_sizes, seed)]
    measured = bandwidth is None
    if measured:
        bandwidth = read_bandwidth()
    cpu_before = _cpu_snapshot()
    times: dict[tuple[str, int], list[float]] = {(p, q): [] for p, q, _, _ in pairs}
    sync = _sync_for(device)
    with torch.inference_mode():
        for r in progress_bar(range(warmup + repeats), total=warmup + repeats, desc="precision rounds",
                              enabled=progress):
            k = r % len(pairs)
            for p, q, call, reset in pairs[k:] + pairs[:k]:
                if sync is not None:
                    sync()
                t0 = time.perf_counter()
                call()
                if sync is not None:
                    sync()
                dt = (time.perf_counter() - t0) * 1e3
                reset()
                if r >= warmup:
                    times[(p, q)].append(dt)
    other = other_cpu_fraction(cpu_before, _cpu_snapshot())
    if measured:  # measured again after the timing; the floor uses the faster of the two (other load varies)
        after = read_bandwidth()
        bandwidth = {**max(bandwidth, after, key=lambda b: b["gb_per_s"]),
                     "gb_per_s_before": bandwidth["gb_per_s"], "gb_per_s_after": after["gb_per_s"]}
    out = []
    for p, f in keys:
        rows = []
        for q in query_sizes:
            ts = times[((p, f), q)]
            rows.append({"n_queries": q, "median_ms": statistics.median(ts), "p10_ms": _percentile(ts, 10),
                         "p90_ms": _percentile(ts, 90), "min_ms": min(ts), "n": len(ts)})
        t1 = next((r["median_ms"] for r in rows if r["n_queries"] == 1), None)
        for row in rows:
            row["ratio_to_1"] = row["median_ms"] / t1 if t1 else None
        wb = call_weight_bytes(cps[p], n_queries=1)
        fl = floor_ms(wb["bytes"], bandwidth["gb_per_s"])
        out.append({"precision": p, "forward": f, "rows": rows, "weight_bytes": wb, "floor_ms": fl,
                    "t1_over_floor": t1 / fl if t1 else None})
    result = {
        "model": loaded.describe(), "random_weights": bool(loaded.is_random), "timing_only": bool(loaded.is_random),
        "device": str(device), "device_name": cpu_model() if device.type == "cpu" else str(device),
        "cpu_flags": cpu_features(), "native_precisions": list(native_precisions()),
        "threads": torch.get_num_threads(), "bandwidth": bandwidth, "other_cpu_frac": other,
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "prefix_len": prefix_len, "warmup": warmup,
        "repeats": repeats, "seed": seed, "interleaved": True, "forwards": forwards, "precisions": out,
    }
    result["cpu_oversubscribed"] = cpu_oversubscribed(result)
    return result


def _ms(x: float) -> str:
    return f"{x:.2f}" if x >= 1 else f"{x:.3g}"


def format_precision_table(result: dict) -> str:
    """Plain-text table of a :func:`bench_precisions` result: the CPU, its flags and bandwidth, then per precision and
    forward t(1), t(Q)/t(1), the weights one call reads, the floor and t(1) as a multiple of it."""
    m, bw, fl = result["model"], result["bandwidth"], result["cpu_flags"]
    other = result.get("other_cpu_frac")
    lines = [
        f"precisions of the code-predictor call: model {m['name']}"
        f"{' (RANDOM weights: timing only)' if result['random_weights'] else ''} | threads {result['threads']} | "
        f"interleaved, warmup {result['warmup']}, repeats {result['repeats']}, prefix {result['prefix_len']}"
        + ("" if other is None else f" | other processes used {100 * other:.0f}% of {result['cpu_count']} CPUs"
           + (" (OVERSUBSCRIBED, TIMES ARE PESSIMISTIC)" if result.get("cpu_oversubscribed") else "")),
        f"CPU {result['device_name']} | bf16 flags: {', '.join(fl['bf16']) or 'none'} | int8 dot-product flags: "
        f"{', '.join(fl['int8_dot']) or 'none'} | native precisions: {', '.join(result['native_precisions'])}",
        f"read bandwidth {bw['gb_per_s']:.1f} GB/s (torch.sum over {bw['buffer_bytes'] / 2 ** 20:.0f} MiB, median of "
        f"{bw['repeats']}, {bw['threads']} thread{'s' if bw['threads'] != 1 else ''}"
        + (f"; the faster of {bw['gb_per_s_before']:.1f} before and {bw['gb_per_s_after']:.1f} after the timing"
           if "gb_per_s_after" in bw else "") + "); floor = weight bytes of one call / read bandwidth",
    ]
    qs = [r["n_queries"] for r in result["precisions"][0]["rows"]]
    ratio_qs = [q for q in qs if q != 1]
    lines.append(f"{'precision':<12} {'forward':<8} {'t(1) ms':>8} "
                 + " ".join(f"{f't({q})/t(1)':>10}" for q in ratio_qs)
                 + f" {'MB/call':>8} {'floor ms':>9} {'t(1)/floor':>10}")
    for pr in result["precisions"]:
        by_q = {r["n_queries"]: r for r in pr["rows"]}
        t1 = by_q.get(1)
        ratios = " ".join(f"{'' if by_q[q]['ratio_to_1'] is None else format(by_q[q]['ratio_to_1'], '.2f'):>10}"
                          for q in ratio_qs)
        lines.append(f"{pr['precision']:<12} {pr.get('forward', 'official'):<8} "
                     f"{'' if t1 is None else format(t1['median_ms'], '.2f'):>8} {ratios} "
                     f"{pr['weight_bytes']['bytes'] / 1e6:>8.1f} {_ms(pr['floor_ms']):>9} "
                     f"{'' if pr['t1_over_floor'] is None else format(pr['t1_over_floor'], '.2f'):>10}")
    return "\n".join(lines)


def floor_line(result: dict, bandwidth: dict, weight_bytes: dict) -> str:
    """One line under :func:`format_table`: the floor of the code-predictor call of a :func:`bench_model` result and
    t_cp(1) as a multiple of it (``bandwidth``: :func:`rvqspec_lib.eval.floor.read_bandwidth`; ``weight_bytes``:
    :func:`rvqspec_lib.eval.floor.call_weight_bytes`)."""
    from rvqspec_lib.eval.floor import floor_ms

    fl = floor_ms(weight_bytes["bytes"], bandwidth["gb_per_s"])
    t1 = sorted(result["code_predictor"], key=lambda r: r["n_queries"])[0]
    return (f"floor of a code-predictor call: {weight_bytes['bytes'] / 1e6:.1f} MB of weights / "
            f"{bandwidth['gb_per_s']:.1f} GB/s read bandwidth = {_ms(fl)} ms; t_cp({t1['n_queries']}) = "
            f"{t1['median_ms'] / fl:.2f} x floor")
