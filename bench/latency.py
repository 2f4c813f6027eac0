"""Latency of the two loops of Qwen3-TTS, the one grid of timed calls: the talker step and the code-predictor call of
``Q`` positions in one interleaved run, the call per precision and backend and the talker step per precision and
forward against their weight-streaming floors (as text: :func:`format_precision_table`, :func:`format_talker_table`),
and the call budget from the config and from measured tokens per call (notebook 01; ``rvqspec bench latency``, ``bench
precisions``). Why the verify cost curve matters: docs/model.md#two-nested-loops; the floors:
docs/precision.md#the-floor. Timing depends on the architecture, not the weights (``random_weights`` is printed
beside every number)."""

from __future__ import annotations

import copy
import statistics
from typing import Iterable, Sequence

import torch
from torch import nn
from transformers import DynamicCache

from bench import PRECISION_QUERY_SIZES  # t(1) and t(Q)/t(1) of the precision table for these Q
from bench.floor import call_weight_bytes, floor_ms, talker_step_bytes
from bench.frames import format_rows
from rvqspec_lib.eval.acceptance import decoder_statistics
from rvqspec_lib.eval.noise import noise_words
from rvqspec_lib.eval.speed import PREFIX_LEN, QUERY_SIZES, verify_call
from rvqspec_lib.eval.timing import (bandwidth_around, cpu_oversubscribed, device_sync, interleaved, load_words,
                                     machine_lines)
from rvqspec_lib.models.backends import BACKENDS, available, check_available, verify_backend
from rvqspec_lib.models.named_decoders import resolve_all
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.device.precision import PRECISIONS, apply_precision, cpu_features, native_precisions, precision_of

#: KV positions before the timed talker step.
TALKER_CONTEXT = 64
#: Tokens-per-call values tabulated by default; 2.47 is the paper's reported value.
DEFAULT_TOKENS_PER_CALL = (1.0, 1.5, 2.0, 2.47, 3.0)
PAPER_TOKENS_PER_CALL = 2.47
#: The talker step's key among the conditions of :func:`bench_model` (the code-predictor calls are keyed by Q).
TALKER = "talker"
#: The second pair of :func:`bench_model` (``native=True``): the native talker step and the native verify backend,
#: keyed ``(NATIVE, TALKER)`` and ``(NATIVE, Q)``.
NATIVE = "native"


def _query_sizes(query_sizes: Iterable[int]) -> list[int]:
    qs = [int(q) for q in query_sizes]
    if not qs or min(qs) < 1:
        raise ValueError(f"query sizes must be positive whole numbers, e.g. 1,2,4,8; got {list(query_sizes)}")
    return qs


def _grid(conds: dict, bandwidth, **timing):
    """THE timed grid: every condition of ``conds`` in one :func:`~rvqspec_lib.eval.timing.interleaved` run
    (``timing``: its keywords), with the read bandwidth read around it where ``bandwidth`` is ``None`` (else kept as
    given; ``False``: none). Returns ``(timing, bandwidth)``."""
    def measure():
        with torch.inference_mode():
            return interleaved(conds, **timing)
    return bandwidth_around(measure) if bandwidth is None else (measure(), bandwidth or None)


def _rows(t, keys: Sequence, base_key=None) -> list[dict]:
    """A row per condition key: the :func:`~rvqspec_lib.eval.timing.summary`, ``cpu_ms`` (median thread CPU time),
    ``rel_se`` and ``ratio_to_1`` over ``base_key``."""
    base = t.summary(base_key)["median_ms"] if base_key in t.ms else None
    out = []
    for k in keys:
        s = t.summary(k)
        text = "/".join(map(str, k)) if isinstance(k, tuple) else str(k)  # the keys of the meta's rel_se
        out.append({**s, "cpu_ms": statistics.median(t.cpu_ms[k]), "rel_se": t.meta["rel_se"].get(text),
                    "ratio_to_1": s["median_ms"] / base if base else None})
    return out


def _sweep(cp, backend: str, qs: Sequence[int], prefix_len: int, seed: int, key=lambda q: q) -> dict:
    """The code-predictor calls of one (precision, backend) over the Qs: ``{key(Q): call}``."""
    be = verify_backend(backend, cp)
    return {key(q): verify_call(cp, be, q, prefix_len, seed, whole=True) for q in qs}


def _sweep_rows(t, qs: Sequence[int], key=lambda q: q) -> list[dict]:
    """A row per Q of a :func:`_sweep`: ``n_queries`` and :func:`_rows`' fields, ``ratio_to_1`` over its own Q = 1."""
    return [{"n_queries": q, **r} for q, r in zip(qs, _rows(t, [key(q) for q in qs], base_key=key(1)))]


def bench_model(lm, *, prefix_len: int = PREFIX_LEN, query_sizes: Iterable[int] = QUERY_SIZES,
                talker_context: int = TALKER_CONTEXT, backend: str = "official", native: bool = False,
                warmup: int = 3, repeats: int = 20, seed: int = 0, progress: bool = True,
                noise_target: float | None = None, floor: bool = False) -> dict:
    """Per-call latency of a talker step and of code-predictor calls of ``Q`` query positions, interleaved, and the
    frame-level quantities they imply.

    Args:
        lm: a :class:`~rvqspec_lib.models.loader.LoadedModel` (not modified). prefix_len: committed slots before the
            code-predictor call. query_sizes: the Qs (1 among them). talker_context: KV positions before the talker
            step. backend: the call's verify backend.
        native: also the native pair (talker step and ``native`` backend; CPU only) in the same run.
        warmup, repeats, seed, progress, noise_target: :func:`~rvqspec_lib.eval.timing.interleaved`'s.
        floor: also the weight-streaming floor of the Q = 1 call (CPU only).

    Returns:
        JSON-able dict: the timing's meta, ``cpu_oversubscribed``, ``model``, ``device_name``,
        ``code_predictor_precision``, ``backend``, the settings, ``talker_step``, ``code_predictor`` (per Q:
        ``n_queries``, the summary, ``rel_se``, ``ratio_to_1`` = t(Q) / t(1)), ``derived``
        (:func:`derived_from_bench`); with ``native``: ``native``, the same keys for the native pair; with ``floor``:
        ``bandwidth``, ``weight_bytes``, ``floor_ms``.

    Raises:
        ValueError: bad query sizes, ``prefix_len < 1``, ``talker_context < 1``, an absent backend, ``native`` with
            ``backend="native"`` or without the native forward, ``floor`` off the CPU, bad timing settings (one
            line).
    """
    cp = lm.code_predictor
    qs = _query_sizes(query_sizes)
    if prefix_len < 1:
        raise ValueError(f"prefix_len must be >= 1, got {prefix_len}")
    device = next(lm.talker.parameters()).device
    if floor and device.type != "cpu":
        raise ValueError("the weight-streaming floor is measured on the CPU: drop floor=True on a GPU")
    if native and backend == NATIVE:
        raise ValueError("backend='native' already times the native code predictor: give native=True with another "
                         "backend (the official one), or drop it")
    step, crop = official_step(lm.talker, talker_context, seed=seed)
    conds = {TALKER: step, **_sweep(cp, backend, qs, prefix_len, seed)}
    resets = {TALKER: crop}
    if native:
        ok, why = available(NATIVE, precision_of(cp), device.type)
        if not ok:
            raise ValueError(f"native=True: the native forward is absent here ({why})")
        n_step, n_crop = native_step(NativeTalker(lm.talker, max_context=talker_context + 1), talker_context,
                                     seed=seed)
        conds.update({(NATIVE, TALKER): n_step, **_sweep(cp, NATIVE, qs, prefix_len, seed, lambda q: (NATIVE, q))})
        resets[(NATIVE, TALKER)] = n_crop

    t, bandwidth = _grid(conds, None if floor else False, repeats=repeats, warmup=warmup, noise_target=noise_target,
                         seed=seed, sync=device_sync(device), reset=resets,
                         progress=progress, desc=f"bench {lm.name}", module=lm.talker, random_weights=lm.is_random)
    result = {**t.meta, "cpu_oversubscribed": cpu_oversubscribed(t.meta), "model": lm.describe(),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else t.meta["cpu"],
              "code_predictor_precision": precision_of(cp),
              "backend": backend, "prefix_len": prefix_len, "talker_context": talker_context,
              **_pair(t, TALKER, qs, lambda q: q)}
    result["derived"] = derived_from_bench(result, frame_rate_hz=lm.frame_rate_hz, n_code_groups=lm.n_code_groups)
    if native:
        pair = _pair(t, (NATIVE, TALKER), qs, lambda q: (NATIVE, q))
        pair["derived"] = derived_from_bench(pair, frame_rate_hz=lm.frame_rate_hz, n_code_groups=lm.n_code_groups)
        result[NATIVE] = pair
    if floor:
        wb = call_weight_bytes(cp)
        result.update(bandwidth=bandwidth, weight_bytes=wb, floor_ms=floor_ms(wb["bytes"], bandwidth["gb_per_s"]))
    return result


def _pair(t, talker_key, qs: Sequence[int], key_of) -> dict:
    """``{"talker_step", "code_predictor"}`` of one pair; ``ratio_to_1`` over this pair's own Q = 1."""
    talker = _rows(t, [talker_key])[0]
    talker.pop("ratio_to_1")
    return {"talker_step": talker, "code_predictor": _sweep_rows(t, qs, key_of)}


def latency_rows(result: dict) -> list[dict]:
    """Flat table of a :func:`bench_model` result, per pair the talker step then one row per Q: ``call``,
    ``forward``, ``n_queries``, ``median_ms``, ``p10_ms``, ``p90_ms``, ``min_ms``, ``ratio_to_1`` (over the same
    pair's t_cp(1)), ``n``."""
    pairs = [("official", result["backend"], result)] + ([(NATIVE, NATIVE, result[NATIVE])] if NATIVE in result
                                                         else [])
    keys = ("median_ms", "p10_ms", "p90_ms", "min_ms")
    rows = []
    for talker_forward, cp_forward, pair in pairs:
        cp = pair["code_predictor"]
        base = next((r["median_ms"] for r in cp if r["n_queries"] == 1), None)
        t = pair["talker_step"]
        rows.append({"call": f"talker step (ctx {result['talker_context']})", "forward": talker_forward,
                     "n_queries": 1, **{k: t[k] for k in keys}, "ratio_to_1": t["median_ms"] / base if base else None,
                     "n": t["n"]})
        rows += [{"call": f"code predictor (prefix {result['prefix_len']})", "forward": cp_forward,
                  "n_queries": r["n_queries"], **{k: r[k] for k in keys}, "ratio_to_1": r["ratio_to_1"], "n": r["n"]}
                 for r in cp]
    return rows



def format_latency(result: dict) -> str:
    """The latency table of a :func:`bench_model` result with its header and frame-level lines (``rvqspec bench
    latency``)."""
    m, prec = result["model"], result.get("code_predictor_precision")
    head = (f"model {m['name']} ({m['kind']}{', RANDOM weights: timing only' if result['random_weights'] else ''}) | "
            f"device {result['device']} ({result['device_name']}) | dtype {result['dtype']}"
            f"{'' if prec in (None, result['dtype']) else f' (code predictor {prec})'} | "
            f"backend {result['backend']} | threads {result['threads']} | torch {result['torch']} | warmup "
            f"{result['warmup']}, {noise_words(result)}{load_words(result)}")
    lines = [head, format_rows(latency_rows(result), ("call", "forward", "n_queries", "median_ms", "p10_ms", "p90_ms",
                                                      "ratio_to_1"))]
    for name, d in [(result["backend"], result["derived"])] + (
            [(NATIVE, result[NATIVE]["derived"])] if NATIVE in result else []):
        lines.append(f"frame (AR, {name}): {d['frame_ms_ar']:.1f} ms of a {d['frame_budget_ms']:.0f} ms budget "
                     f"(RTF {d['rtf_ar']:.2f}); inner-loop share {100 * d['inner_share_ar']:.1f}%; "
                     f"real time needs {d['calls_per_s_realtime']:.0f} calls/s "
                     f"({d['calls_per_s_at_paper_tpc']:.1f} at {PAPER_TOKENS_PER_CALL} tokens/call)")
    if "floor_ms" in result:
        bw, t1 = result["bandwidth"], min(result["code_predictor"], key=lambda r: r["n_queries"])
        lines.append(f"floor of a code-predictor call: {result['weight_bytes']['bytes'] / 1e6:.1f} MB of weights / "
                     f"{bw['gb_per_s']:.1f} GB/s read bandwidth = {result['floor_ms']:.3g} ms; "
                     f"t_cp({t1['n_queries']}) = {t1['median_ms'] / result['floor_ms']:.2f} x floor")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------------
# Precisions and backends side by side, against the weight-streaming floor (docs/precision.md)
# ----------------------------------------------------------------------------------------------------------------------
def bench_precisions(lm, precisions: Sequence[str], *, backends: Sequence[str] = ("official",),
                     query_sizes: Iterable[int] = PRECISION_QUERY_SIZES, prefix_len: int = PREFIX_LEN,
                     warmup: int = 3, repeats: int = 20, seed: int = 0, bandwidth: dict | None = None,
                     progress: bool = True, noise_target: float | None = None) -> dict:
    """The code-predictor call of ``Q`` positions per precision and verify backend, in ONE interleaved run, each
    against its weight-streaming floor.

    Args:
        lm: a loaded model on the CPU, code predictor in float32 (not modified; callers check the precisions).
            precisions, backends: names of :data:`~rvqspec_lib.device.precision.PRECISIONS` and
            :data:`~rvqspec_lib.models.backends.BACKENDS`.
        bandwidth: a :func:`rvqspec_lib.eval.timing.read_bandwidth` result; ``None``: read around the timing.
        query_sizes, prefix_len, warmup, repeats, seed, progress, noise_target: as :func:`bench_model`.

    Returns:
        JSON-able dict: the timing's meta, ``cpu_oversubscribed``, ``model``, ``device_name``, ``precision_flags``,
        ``native_precisions``, ``bandwidth``, ``prefix_len``, ``backends``, and ``precisions``: per (precision,
        backend) ``precision``, ``backend``, ``rows`` (as :func:`bench_model`'s ``code_predictor``), ``weight_bytes``,
        ``floor_ms``, ``t1_over_floor``.

    Raises:
        ValueError: an unknown precision or backend, one absent at a precision, bad query sizes, a model off the CPU,
            bad timing settings (one line each).
    """
    qs, precisions, backends = _query_sizes(query_sizes), list(precisions), list(backends)
    bad = [p for p in precisions if p not in PRECISIONS] + [b for b in backends if b not in BACKENDS]
    if not precisions or not backends or bad:
        raise ValueError(f"give precisions of {', '.join(PRECISIONS)} and backends of {', '.join(BACKENDS)}; got "
                         f"{precisions} and {backends}")
    base = lm.code_predictor
    if next(base.parameters()).device.type != "cpu":
        raise ValueError("the weight-streaming floor is measured on the CPU: load the model on the CPU")
    cps = {p: apply_precision(copy.deepcopy(base), p, require_native=False) for p in precisions}
    conds = {}
    for p in precisions:
        for b in backends:
            check_available(b, p)
            conds.update(_sweep(cps[p], b, qs, prefix_len, seed, lambda q, p=p, b=b: (p, b, q)))

    t, bandwidth = _grid(conds, bandwidth, repeats=repeats, warmup=warmup, noise_target=noise_target, seed=seed,
                         progress=progress, desc="precisions", random_weights=lm.is_random)
    out = []
    for p in precisions:
        wb = call_weight_bytes(cps[p])
        fl = floor_ms(wb["bytes"], bandwidth["gb_per_s"])
        for b in backends:
            rows = _sweep_rows(t, qs, lambda q, p=p, b=b: (p, b, q))
            t1 = next((r["median_ms"] for r in rows if r["n_queries"] == 1), None)
            out.append({"precision": p, "backend": b, "rows": rows, "weight_bytes": wb, "floor_ms": fl,
                        "t1_over_floor": t1 / fl if t1 else None})
    return {**t.meta, "cpu_oversubscribed": cpu_oversubscribed(t.meta), "model": lm.describe(),
            "device_name": t.meta["cpu"], "precision_flags": cpu_features(),
            "native_precisions": list(native_precisions()), "bandwidth": bandwidth, "prefix_len": prefix_len,
            "backends": backends, "precisions": out}


def format_precision_table(result: dict) -> str:
    """A :func:`bench_precisions` result as text (``rvqspec bench precisions``): the title, model, threads and timing;
    the CPU and bandwidth; then :func:`precision_rows` (the call and its floor)."""
    return _floor_text("precisions of the code-predictor call", result["model"]["name"], result,
                       f"{noise_words(result)}, prefix {result['prefix_len']}", result["precision_flags"],
                       "floor = weight bytes of one call / read bandwidth", precision_rows(result))


def format_talker_table(result: dict) -> str:
    """A :func:`bench_talker_precisions` result as text: the title, model, threads and timing; the CPU and bandwidth;
    then per row the step, the MB it reads and both floors."""
    cols = ("precision", "context", "forward", "median_ms", "p10_ms", "p90_ms", "cpu_ms", "weights_mb", "kv_mb",
            "floor_ms", "over_floor", "floor_kv_ms", "over_floor_kv", "cpu_over_floor", "cpu_over_floor_kv")
    rows = [{**r, "weights_mb": r["weight_bytes"] / 1e6, "kv_mb": r["kv_bytes"] / 1e6} for r in result["rows"]]
    return _floor_text("talker step (1 new position + codec_head)", result["model"], result,
                       f"repeats {result['repeats']}", result["cpu_flags"],
                       "floor = weight bytes / bandwidth; floor_kv adds the KV cache the step attends; cpu_over: the "
                       "thread's CPU time over the same floors at the CPU-time bandwidth", rows, cols)


def _floor_text(title: str, model: str, result: dict, timing_words: str, flags: dict, floor_words: str,
                rows: list[dict], columns: Sequence[str] | None = None) -> str:
    """The one text of a table against the floor: ``title``, the model, threads and timing; the CPU and bandwidth
    (:func:`~rvqspec_lib.eval.timing.machine_lines`); the rows."""
    return "\n".join([
        f"{title}: model {model}{' (RANDOM weights: timing only)' if result['random_weights'] else ''} | threads "
        f"{result['threads']} | interleaved, warmup {result['warmup']}, {timing_words}" + load_words(result),
        *machine_lines(result, flags, floor_words), format_rows(rows, columns)])


def precision_rows(result: dict) -> list[dict]:
    """A :func:`bench_precisions` result as rows: ``precision``, ``backend``, ``t1_ms``, ``t{Q}_over_t1``,
    ``mb_per_call`` (MB of weights one call reads), ``floor_ms``, ``t1_over_floor``."""
    rows = []
    for pr in result["precisions"]:
        by_q = {r["n_queries"]: r for r in pr["rows"]}
        rows.append({"precision": pr["precision"], "backend": pr["backend"],
                     "t1_ms": by_q[1]["median_ms"] if 1 in by_q else None,
                     **{f"t{q}_over_t1": r["ratio_to_1"] for q, r in by_q.items() if q != 1},
                     "mb_per_call": pr["weight_bytes"]["bytes"] / 1e6, "floor_ms": pr["floor_ms"],
                     "t1_over_floor": pr["t1_over_floor"]})
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# The call budget (from the config, never typed in)
# ----------------------------------------------------------------------------------------------------------------------
def call_budget(frame_rate_hz: float, n_code_groups: int, tokens_per_call: float | None = None) -> dict:
    """Model calls per second needed for real time: one talker call plus ``(n_code_groups - 1) / tokens_per_call``
    inner calls per frame.

    Args:
        frame_rate_hz: codec frames per second (``LoadedModel.frame_rate_hz``). n_code_groups: codebooks per frame
            (``LoadedModel.n_code_groups``). tokens_per_call: mean inner-loop codes per inner call, the prefill
            counted; ``None``: plain AR (1.0).

    Returns:
        ``{"frame_rate_hz", "n_code_groups", "tokens_per_call", "inner_calls_per_frame", "calls_per_frame",
        "calls_per_s", "calls_per_s_ar", "reduction"}``, ``reduction = calls_per_s_ar / calls_per_s`` (200 calls/s
        for 12.5 Hz, 16 groups at tpc 1; 88.4 at tpc 2.47).

    Raises:
        ValueError: ``frame_rate_hz <= 0``, ``n_code_groups < 2`` or ``tokens_per_call <= 0``.
    """
    tpc = 1.0 if tokens_per_call is None else float(tokens_per_call)
    if frame_rate_hz <= 0 or n_code_groups < 2 or tpc <= 0:
        raise ValueError(f"need frame_rate_hz > 0, n_code_groups >= 2, tokens_per_call > 0; got "
                         f"{frame_rate_hz}, {n_code_groups}, {tokens_per_call}")
    inner = (n_code_groups - 1) / tpc
    ar, cps = frame_rate_hz * n_code_groups, frame_rate_hz * (1.0 + inner)
    return {"frame_rate_hz": float(frame_rate_hz), "n_code_groups": int(n_code_groups), "tokens_per_call": tpc,
            "inner_calls_per_frame": inner, "calls_per_frame": 1.0 + inner, "calls_per_s": cps, "calls_per_s_ar": ar,
            "reduction": ar / cps}


def budget_table(frame_rate_hz: float, n_code_groups: int,
                 tokens_per_call: Iterable[float] = DEFAULT_TOKENS_PER_CALL) -> list[dict]:
    """:func:`call_budget` per tokens-per-call value, with a ``note`` ("plain AR", "paper's reported value")."""
    rows = []
    for tpc in tokens_per_call:
        b = call_budget(frame_rate_hz, n_code_groups, tpc)
        note = "plain AR" if tpc == 1 else ("paper's reported value" if abs(tpc - PAPER_TOKENS_PER_CALL) < 1e-9 else "")
        rows.append({"tokens_per_call": b["tokens_per_call"], "inner_calls_per_frame": b["inner_calls_per_frame"],
                     "calls_per_s": b["calls_per_s"], "reduction": b["reduction"], "note": note})
    return rows


def model_row(result: dict) -> dict:
    """One flat row of a :func:`bench_model` result to set models side by side: geometry, call budget, per pair the
    talker step, the Q = 1 call, the AR frame, RTF, inner share and ``t(q)/t(1)`` at the largest timed q <= 16 (the
    native pair's prefixed ``native_``).

    Raises:
        KeyError: ``result`` is not a :func:`bench_model` result.
    """
    m = result["model"]
    q = max((r["n_queries"] for r in result["code_predictor"] if r["n_queries"] <= 16), default=None)

    def pair(p: dict | None) -> dict:
        ratio = p and next((r["ratio_to_1"] for r in p["code_predictor"] if r["n_queries"] == q), None)
        return {**{k: p and p["derived"][k] for k in ("t_talker_ms", "t_inner_ms", "frame_ms_ar", "rtf_ar",
                                                       "inner_share_ar")}, f"t({q})/t(1)": ratio}

    official, native = pair(result), pair(result.get(NATIVE))
    return {"model": m["name"], "random_weights": result["random_weights"],
            **{k: m[k] for k in ("talker_layers", "talker_hidden", "code_predictor_layers", "code_predictor_hidden",
                                 "params_talker_total", "params_code_predictor", "frame_rate_hz", "n_code_groups")},
            "calls_per_s_realtime": call_budget(m["frame_rate_hz"], m["n_code_groups"])["calls_per_s"],
            **official, **{f"{NATIVE}_{k}": v for k, v in native.items()}}


def inner_share_from_bytes(lm, *, talker_context: int = TALKER_CONTEXT) -> dict:
    """The inner loop's share of an AR frame at the weight-streaming floor, from the bytes read (no timing).

    Returns:
        ``{"talker_step_bytes", "talker_kv_bytes", "code_predictor_call_bytes", "inner_calls_per_frame",
        "inner_share"}``.
    """
    talker = talker_step_bytes(lm.talker, context=talker_context)
    cp = call_weight_bytes(lm.code_predictor)["bytes"]
    n_inner = lm.n_code_groups - 1
    return {"talker_step_bytes": talker["bytes"], "talker_kv_bytes": talker["kv_bytes"],
            "code_predictor_call_bytes": cp, "inner_calls_per_frame": n_inner,
            "inner_share": inner_share(talker["bytes"] + talker["kv_bytes"], cp, n_inner)}


def calls_at_tokens_per_call(lm, names: Sequence[str], contexts: torch.Tensor, *, sampling=None, seed: int = 0,
                             calibrations: dict | None = None) -> list[dict]:
    """The call budget at the tokens per call each named decoder commits on ``lm`` over the same contexts (the
    lossless walk).

    Args:
        lm: a trained model (acceptance on random weights means nothing) whose folder ships what the names read.
            names: decoder names of the grammar. contexts: ``(N, 2, talker_hidden)``. sampling: default
            :class:`~rvqspec_lib.decoding.sampling.Sampling`'s. seed: each decoder's generator. calibrations:
            ``{drafter: calibration}`` instead of the shipped files.

    Returns:
        One row per decoder, in order: its fields, ``model``, ``frames``, ``tokens_per_call``,
        ``inner_calls_per_frame``, ``calls_per_s``, ``reduction_vs_ar`` (:func:`call_budget`).

    Raises:
        ValueError: a bad name or a file it needs missing (the resolver's one-line messages).
    """
    named = resolve_all(list(names), lm, calibrations=calibrations)
    rows = []
    for label, nd in named.items():
        st = decoder_statistics(lm.code_predictor, None, contexts, nd.decoder, sampling=sampling, seed=seed)
        b = call_budget(lm.frame_rate_hz, lm.n_code_groups, st["tokens_per_call"])
        rows.append({**nd.fields(), "model": lm.name, "frames": int(contexts.shape[0]),
                     "tokens_per_call": st["tokens_per_call"], "inner_calls_per_frame": b["inner_calls_per_frame"],
                     "calls_per_s": b["calls_per_s"], "reduction_vs_ar": b["reduction"]})
    return rows


def inner_share(t_talker_ms: float, t_inner_ms: float, n_inner_calls: float = 15) -> float:
    """Share of a frame's model time in the inner loop: ``n * t_inner / (t_talker + n * t_inner)`` (times in ms).

    Raises:
        ValueError: negative times or call counts, or a zero total.
    """
    if t_talker_ms < 0 or t_inner_ms < 0 or n_inner_calls < 0:
        raise ValueError("times and call counts must be non-negative")
    total = t_talker_ms + n_inner_calls * t_inner_ms
    if total <= 0:
        raise ValueError("total frame time is zero")
    return n_inner_calls * t_inner_ms / total


def derived_from_bench(result: dict, *, frame_rate_hz: float, n_code_groups: int) -> dict:
    """Frame-level quantities of a :func:`bench_model` result (plain AR; ``t_cp(1)`` the Q = 1 median, else the
    smallest Q's).

    Returns:
        ``{"inner_calls_per_frame", "t_talker_ms", "t_inner_ms", "frame_ms_ar", "frame_budget_ms", "rtf_ar",
        "inner_share_ar", "calls_per_s_realtime", "calls_per_s_at_paper_tpc"}``; ``frame_ms_ar = t_talker + (G - 1) *
        t_cp(1)``, ``frame_budget_ms = 1000 / frame_rate_hz``, ``rtf_ar = frame_ms_ar / frame_budget_ms``.
    """
    t_inner = min(result["code_predictor"], key=lambda r: r["n_queries"])["median_ms"]
    t_talker = result["talker_step"]["median_ms"]
    n_inner = n_code_groups - 1
    frame_ms, budget_ms = t_talker + n_inner * t_inner, 1000.0 / frame_rate_hz
    return {"inner_calls_per_frame": n_inner, "t_talker_ms": t_talker, "t_inner_ms": t_inner,
            "frame_ms_ar": frame_ms, "frame_budget_ms": budget_ms, "rtf_ar": frame_ms / budget_ms,
            "inner_share_ar": inner_share(t_talker, t_inner, n_inner),
            "calls_per_s_realtime": call_budget(frame_rate_hz, n_code_groups)["calls_per_s"],
            "calls_per_s_at_paper_tpc": call_budget(frame_rate_hz, n_code_groups, PAPER_TOKENS_PER_CALL)["calls_per_s"]}


# ----------------------------------------------------------------------------------------------------------------------
# The talker step per precision, official and native, against its floor (docs/precision.md#the-native-talker);
# what attending over the filled prefix of the native cache saves
# ----------------------------------------------------------------------------------------------------------------------
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

    t, bandwidth = _grid({k: call for k, call, _ in conditions}, bandwidth, repeats=repeats, warmup=warmup,
                         reset={k: reset for k, _, reset in conditions}, progress=progress, desc="talker rounds")
    meta, stats = t.meta, dict(zip(t.ms, _rows(t, list(t.ms))))
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

    t, _ = _grid({"prefix": run(False), "whole": run(True)}, False, repeats=repeats, warmup=warmup,
                 reset={"prefix": lambda: nt.crop(context), "whole": lambda: nt.crop(context)})
    st = dict(zip(t.ms, _rows(t, list(t.ms))))
    return {"context": context, "capacity": capacity, "prefix_ms": st["prefix"]["median_ms"],
            "whole_cache_ms": st["whole"]["median_ms"],
            "saved_ms": st["whole"]["median_ms"] - st["prefix"]["median_ms"],
            "prefix_cpu_ms": st["prefix"]["cpu_ms"], "whole_cache_cpu_ms": st["whole"]["cpu_ms"],
            "saved_cpu_ms": st["whole"]["cpu_ms"] - st["prefix"]["cpu_ms"]}
