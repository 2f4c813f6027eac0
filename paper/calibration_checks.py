"""Notebook 04's checks of the calibrated trees (docs/methods.md#choosing-the-node-budget): the tokens per call each
decoder's calibration predicts against what it measures (:func:`predicted_vs_measured`), and whether a point-mass
tree overtakes a sampled one as p sharpens (:func:`temperature_sweep`, :func:`point_mass_overtakes`)."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import torch

from rvqspec_lib.data.frame_sources import frames_from_contexts
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decoder_names import name_of, tree_from_calibration
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.eval.acceptance import decoder_statistics
from rvqspec_lib.eval.calibration import KINDS, calibrate, predicted


def predicted_vs_measured(code_predictor, decoders, contexts: torch.Tensor, *,
                          calibrations: Mapping[str, dict] | None = None, sampling: Sampling | None = None,
                          seed: int = 0) -> list[dict]:
    """E(N) predicted from each decoder's own calibration against the tokens per call it measures on the same held-out
    ``contexts`` ``(N, 2, talker_hidden)``, every decoder from generator seed ``seed``
    (docs/methods.md#choosing-the-node-budget). ``decoders``: resolved
    :class:`~rvqspec_lib.models.named_decoders.NamedDecoder` s (a mapping's values are taken); ``calibrations``:
    ``{drafter: calibration}`` for decoders that carry none (chains, trees of rank paths).

    Returns:
        a row per decoder: its fields, ``depth`` (the deepest offset drafted), ``predicted_tokens_per_call`` (``None``
        without a calibration), ``measured_tokens_per_call``, ``relative_error`` (predicted / measured - 1),
        ``calls_per_frame``, ``frames``.
    Raises:
        ValueError: no decoder; as :func:`predicted`.
    """
    decoders = list(decoders.values()) if isinstance(decoders, Mapping) else list(decoders)
    if not decoders:
        raise ValueError("no decoder to measure: give NamedDecoders (resolve_all)")
    calibrations = dict(calibrations or {})
    n = P.n_codes(code_predictor)
    rows = []
    for nd in decoders:
        dec = getattr(nd, "decoder", nd)
        name = nd.name if hasattr(nd, "decoder") else name_of(nd)
        cal = getattr(nd, "calibration", None) or calibrations.get(name.drafter or "heads")
        st = decoder_statistics(code_predictor, None, contexts, dec, sampling=sampling, seed=seed)
        pred = predicted(cal, name, dec) if cal is not None or name.kind == "ar" else None
        m = st["tokens_per_call"]  # relative error: NaN when nothing was measured
        rows.append({**name.fields(), "depth": dec.tree(n).max_depth, "predicted_tokens_per_call": pred,
                     "measured_tokens_per_call": m,
                     "relative_error": None if pred is None else pred / m - 1.0 if m and not math.isnan(m) else np.nan,
                     "calls_per_frame": st["calls_per_frame"], "frames": int(contexts.shape[0])})
    return rows


#: Code-predictor temperatures of :func:`temperature_sweep` by default (the checkpoints sample at 0.9).
SWEEP_TEMPERATURES = (1.5, 1.2, 0.9, 0.7, 0.5, 0.3, 0.2, 0.1)


@torch.no_grad()
def temperature_sweep(code_predictor, calibration_contexts: torch.Tensor, eval_contexts: torch.Tensor, *,
                      temperatures: Sequence[float] = SWEEP_TEMPERATURES, budget: int = 16,
                      sampling: Sampling | None = None, seed: int = 0) -> list[dict]:
    """Does a point-mass tree overtake a sampled tree as p sharpens? At each temperature (top-k and top-p as
    ``sampling``'s) the calibration contexts' codes are sampled again, both kinds of tree of ``budget`` nodes calibrated
    on them for the reused heads (one draw) and decoded on the held-out contexts (``(N, 2, talker_hidden)`` each) at
    that temperature.

    Returns:
        a row per (temperature, kind): ``temperature``, ``kind``, ``nodes``, ``predicted_tokens_per_call``,
        ``measured_tokens_per_call``, ``top1_target_mass`` (E[p] of the rank-0 draft at offset 1: one point-mass
        child's worth), ``first_child_acceptance`` (``sum min(p, q)`` at offset 1: one sampled child's).
    Raises:
        ValueError: no temperature, one <= 0; as :func:`calibrate`.
    """
    temps = [float(t) for t in temperatures]
    if not temps or min(temps) <= 0:
        raise ValueError(f"temperatures must be positive (greedy decoding has no tree to compare), got {temperatures}")
    base = Sampling() if sampling is None else sampling
    drafter = ReusedHeads()
    rows = []
    for temp in temps:
        s_t = Sampling(temperature=temp, top_k=base.top_k, top_p=base.top_p)
        frames = frames_from_contexts(code_predictor, calibration_contexts, sampling=s_t, seed=seed)
        cal = calibrate(code_predictor, drafter, frames, sampling=s_t, budgets=(budget,), draws=1, seed=seed)
        for kind in KINDS:
            tree = tree_from_calibration(cal, kind, budget)
            st = decoder_statistics(code_predictor, drafter, eval_contexts, tree, sampling=s_t, seed=seed)
            rows.append({"temperature": temp, "kind": kind, "nodes": budget,
                         "predicted_tokens_per_call": float(cal[kind]["predicted_tokens_per_call"][str(budget)]),
                         "measured_tokens_per_call": st["tokens_per_call"],
                         "top1_target_mass": float(cal["point-mass"]["table"][0][0]),
                         "first_child_acceptance": float(cal["sampled"]["table"][0][0])})
    return rows


def point_mass_overtakes(rows: Sequence[dict]) -> list[float]:
    """The temperatures of a :func:`temperature_sweep` at which the point-mass tree
    commits more codes per call (measured) than the sampled tree, in the sweep's order."""
    by = {(r["temperature"], r["kind"]): r["measured_tokens_per_call"] for r in rows}
    temps = list(dict.fromkeys(r["temperature"] for r in rows))
    return [t for t in temps if (t, "point-mass") in by and (t, "sampled") in by
            and by[(t, "point-mass")] > by[(t, "sampled")]]
