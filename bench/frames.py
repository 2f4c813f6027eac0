"""Whole frames batched, and what is read off timed frame rows (:func:`rvqspec_lib.eval.speed.time_frames`): the
speedup by node budget N (the paper's Figure 4), measured and projected, the per-backend summary, the speedups over
every AR, and result rows as THE Markdown table (notebooks 04, 06, 07; ``rvqspec bench frames``)."""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence

import torch

from rvqspec_lib.common.provenance import markdown_table
from rvqspec_lib.eval.speed import _frame_inputs, _generator, _speedups
from rvqspec_lib.eval.timing import device_sync, interleaved
from rvqspec_lib.models.backends import runner_fields, runner_label

#: Batch sizes of :func:`batch_throughput`.
BATCH_SIZES = (1, 4, 16)


# ----------------------------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------------------------
def batch_throughput(runners: Sequence, contexts: torch.Tensor, *, batch_sizes: Sequence[int] = BATCH_SIZES,
                     repeats: int = 5, warmup: int = 1, seed: int = 0, progress: bool = True,
                     noise_target: float | None = None) -> dict:
    """Frames per second of batched decoding: one call of a runner over B frames, every (runner, B) interleaved.

    Args:
        runners, contexts, others: as :func:`~rvqspec_lib.eval.speed.time_frames`; a batch of B takes B consecutive contexts from ``r * B``
            in round r (wrapping around). batch_sizes: the Bs.

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per (runner, B): the runner's fields, ``batch``, ``ms_per_batch``
        (median), ``p10_ms``, ``p90_ms``, ``frames_per_s``, ``tokens_per_call`` (over the slowest row's calls),
        ``speedup_vs_ar`` (frames per second over stepped AR of the same backend and B).

    Raises:
        ValueError: bad contexts or batch sizes, bad settings.
    """
    cp, contexts = _frame_inputs(runners, contexts)
    bs = [int(b) for b in batch_sizes]
    if not bs or min(bs) < 1:
        raise ValueError(f"batch sizes must be >= 1, got {batch_sizes}")
    n_ctx, dev = contexts.shape[0], contexts.device

    def condition(runner, b):
        def run(r: int):
            idx = (torch.arange(b) + r * b) % n_ctx
            res = runner(contexts[idx.to(dev)], _generator(dev, seed + r))
            return res.codes.shape[1] / float(res.calls.max())
        return run

    conds = {(i, b): condition(r, b) for i, r in enumerate(runners) for b in bs}
    t = interleaved(conds, repeats=repeats, warmup=warmup, noise_target=noise_target, seed=seed,
                    sync=device_sync(dev), progress=progress, desc="batches", module=cp)
    rows = []
    for (i, b) in conds:
        s = t.summary((i, b))
        rows.append({**runner_fields(runners[i]), "batch": b, "ms_per_batch": s["median_ms"], "p10_ms": s["p10_ms"],
                     "p90_ms": s["p90_ms"], "frames_per_s": b / (s["median_ms"] / 1e3),
                     "tokens_per_call": statistics.fmean(t.out[(i, b)][:repeats])})
    for r in rows:
        r["ms_per_frame"] = r["ms_per_batch"] / r["batch"]
    _speedups(rows)
    return {"rows": rows, "meta": {**t.meta, "n_contexts": int(n_ctx)}}


# ----------------------------------------------------------------------------------------------------------------
# Speedup by node budget: measured and projected (the paper's Figure 4)
# ----------------------------------------------------------------------------------------------------------------
def speedup_vs_n(rows: Sequence[dict]) -> list[dict]:
    """Per (backend, precision, fused) and node budget N of :func:`~rvqspec_lib.eval.speed.time_frames` rows: the best stepped speedup over
    AR.

    Returns:
        rows ``backend``, ``precision``, ``nodes``, ``decoder``, ``speedup_vs_ar``, ``ms_per_frame``,
        ``tokens_per_call``, sorted by backend then N.
    """
    best: dict = {}
    for r in rows:
        if r.get("speedup_vs_ar") is None or r["fused"] or r.get("nodes") is None or r.get("lossy"):
            continue
        k = (r["backend"], r["precision"], r["nodes"])
        if k not in best or r["speedup_vs_ar"] > best[k]["speedup_vs_ar"]:
            best[k] = r
    return [{"backend": k[0], "precision": k[1], "nodes": k[2], "decoder": r["decoder"],
             "speedup_vs_ar": r["speedup_vs_ar"], "ms_per_frame": r["ms_per_frame"],
             "tokens_per_call": r["tokens_per_call"]} for k, r in sorted(best.items())]


def fastest(rows, default=None):
    """The row of least ``ms_per_frame`` (``default`` when there is none)."""
    return min(rows, key=lambda r: r["ms_per_frame"], default=default)


def _ratio(a, b):
    return a / b if a and b else None


def summary_by_backend(rows: Sequence[dict]) -> list[dict]:
    """Per backend and precision of :func:`~rvqspec_lib.eval.speed.time_frames` rows: AR stepped and fused, the fastest lossless speculative
    decoder stepped and fused, and their speedups.

    Returns:
        rows ``backend``, ``precision``, ``ar_ms``, ``fused_ar_ms``, ``best_decoder``, ``best_nodes``, ``best_ms``,
        ``best_tokens_per_call``, ``best_speedup_vs_ar``, ``best_speedup_vs_fused``, ``fused_spec_decoder``,
        ``fused_spec_ms``, ``fused_spec_speedup_vs_fused``, ``fused_speedup_vs_ar``; ``None`` where a row is missing.
    """
    out = []
    for b, prec in dict.fromkeys((r["backend"], r["precision"]) for r in rows):
        mine = [r for r in rows if (r["backend"], r["precision"]) == (b, prec)]
        ar, far = ({r["kind"]: r["ms_per_frame"] for r in mine if r["kind"] == "ar" and r["fused"] == f}.get("ar")
                   for f in (False, True))
        spec = [r for r in mine if r["kind"] != "ar" and not r["lossy"]]
        best, fspec = (fastest((r for r in spec if r["fused"] == f), {}) for f in (False, True))
        out.append({"backend": b, "precision": prec, "ar_ms": ar, "fused_ar_ms": far,
                    "best_decoder": best.get("decoder"), "best_nodes": best.get("nodes"),
                    "best_ms": best.get("ms_per_frame"), "best_tokens_per_call": best.get("tokens_per_call"),
                    "best_speedup_vs_ar": _ratio(ar, best.get("ms_per_frame")),
                    "best_speedup_vs_fused": _ratio(far, best.get("ms_per_frame")),
                    "fused_spec_decoder": fspec.get("decoder"), "fused_spec_ms": fspec.get("ms_per_frame"),
                    "fused_spec_speedup_vs_fused": _ratio(far, fspec.get("ms_per_frame")),
                    "fused_speedup_vs_ar": _ratio(ar, far)})
    return out


def expected_tokens_per_call(calibration: dict, kind: str | None = None) -> dict:
    """``{N: E(N)}``, the tokens per call a calibration predicts per frame (the codes a frame commits over its verify
    calls, the prefill call counted, drafts cut at the frame's last depth: what a decoder measures) for the ``kind``
    of tree (``"point-mass"``, ``"sampled"``; ``None``: the better at each N).

    Raises:
        KeyError: a kind the calibration does not hold.
    """
    if kind is not None:
        return {int(n): float(e) for n, e in calibration[kind]["predicted_tokens_per_call"].items()}
    return {int(n): float(calibration[kd]["predicted_tokens_per_call"][n])
            for n, kd in calibration["best_kind"].items()}


def projected_speedup(expected_tokens: Mapping, cost_rows: Sequence[dict]) -> list[dict]:
    """``speedup(N) = E(N) / (t(N) / t(1))`` per backend: a PROJECTION at the call level, every call of a frame costed
    as one verify call of N positions (docs/methods.md#choosing-the-node-budget).

    Args:
        expected_tokens: ``{N: E(N)}`` (:func:`expected_tokens_per_call`). cost_rows: :func:`~rvqspec_lib.eval.speed.verify_cost_curve` rows.

    Returns:
        rows ``backend``, ``nodes``, ``expected_tokens``, ``cost_ratio`` (t(N)/t(1)), ``projected_speedup``.
    """
    out = []
    for r in sorted(cost_rows, key=lambda r: (r["backend"], r["query_positions"])):
        n = r["query_positions"]
        e = expected_tokens.get(n, expected_tokens.get(str(n)))
        if e is None or n == 1:
            continue
        out.append({"backend": r["backend"], "nodes": n, "expected_tokens": float(e), "cost_ratio": r["ratio_to_q1"],
                    "projected_speedup": float(e) / r["ratio_to_q1"]})
    return out


def speedups_over_ar(rows: Sequence[dict]) -> list[dict]:
    """Which AR is fastest, and what speculation gains over each AR (every AR row of the run a baseline), from
    :func:`~rvqspec_lib.eval.speed.time_frames` rows.

    Returns:
        rows, fastest AR first: ``ar`` (a label), ``backend``, ``fused``, ``precision``, ``ar_ms``, ``fastest_ar``,
        ``ar_vs_fastest_ar`` (over the fastest AR's time), ``fastest_speculative`` (lossless, any backend), ``speedup``,
        ``same_backend_speculative``, ``same_backend_speedup``, ``paper_decoder`` (the fastest of ``kind`` ``paper``),
        ``paper_speedup`` (``None`` where the run has no such row); speedups over that AR row. Empty without an AR row.
    """
    ars = sorted((r for r in rows if r["kind"] == "ar"), key=lambda r: r["ms_per_frame"])
    spec = [r for r in rows if r["kind"] != "ar" and not r.get("lossy")]
    best, paper = fastest(spec), fastest([r for r in spec if r["kind"] == "paper"])
    out = []
    for i, a in enumerate(ars):
        same = fastest([r for r in spec if (r["backend"], r["precision"]) == (a["backend"], a["precision"])])
        out.append({"ar": runner_label(a), "backend": a["backend"], "fused": bool(a["fused"]),
                    "precision": a["precision"],
                    "ar_ms": a["ms_per_frame"], "fastest_ar": i == 0,
                    "ar_vs_fastest_ar": a["ms_per_frame"] / ars[0]["ms_per_frame"],
                    "fastest_speculative": best and runner_label(best),
                    "speedup": _ratio(a["ms_per_frame"], best and best["ms_per_frame"]),
                    "same_backend_speculative": same and runner_label(same),
                    "same_backend_speedup": _ratio(a["ms_per_frame"], same and same["ms_per_frame"]),
                    "paper_decoder": paper and runner_label(paper),
                    "paper_speedup": _ratio(a["ms_per_frame"], paper and paper["ms_per_frame"])})
    return out


def format_rows(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """Result rows as THE Markdown table of the project (:func:`rvqspec_lib.common.provenance.markdown_table`, what
    every saved table holds: 4 significant digits), of ``columns`` (default the first row's keys); "" without rows."""
    cols = list(columns or (rows[0].keys() if rows else ()))
    return markdown_table(cols, [[r.get(c) for c in cols] for r in rows]).rstrip("\n") if rows else ""
