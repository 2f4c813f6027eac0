"""Table 2 here: drafters compared on one model as the paper measures them (paper §3.3 Table 2 and Figure 3; notebook
03; docs/methods.md#reused-heads, #medusa-heads, #position-aware-offsets): each drafter with its OWN calibrated
point-mass tree; the paper's quoted values only in ``paper: ...`` columns. Deterministic given ``seed``."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import torch

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.decoding.decoder_names import PAPER_BUDGET, format_paths
from rvqspec_lib.decoding.decoders import CHAIN_WINDOWS, DEFAULT_TREE
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.eval import acceptance as A
from paper import headroom as H
from paper.notebook_measures import saturation_window
from rvqspec_lib.eval.calibration import calibrate
from rvqspec_lib.models.configs import CONFIG_DIR
from paper.drafter_training import params_added_for_config
from rvqspec_lib.models.named_decoders import resolve

#: The paper's Table 2 (§3.3), quoted: tokens per call ("toks/step") of each drafter with its sparse tree of
#: N = 32 nodes on Qwen3-TTS-0.6B, keyed by this module's drafter labels (the paper trains its offsets with
#: cross-entropy and its Medusa heads as Medusa-1 does).
PAPER_TOKS_PER_STEP = {"heads": 1.70, "medusa": 2.60, "offsets-ce": 2.47}
#: The paper's parameters added, quoted as it writes them (Medusa: "~94M"; 45 heads on the 0.6B code predictor).
PAPER_PARAMS_ADDED = {"heads": "0", "medusa": "~94M", "offsets-ce": "3,072"}
#: Where the quoted values come from (a table's caption and a figure's label say it).
PAPER_SOURCE = "paper Table 2 (§3.3): Qwen3-TTS-0.6B, sparse point-mass tree of N = 32, toks/step"
#: The released 0.6B configuration: parameter counts of each drafter at the paper's size.
RELEASED_06B_CONFIG = CONFIG_DIR / "Qwen3-TTS-12Hz-0.6B-CustomVoice" / "config.json"
#: What each drafter label stands for (Table 2's rows (i)-(iii), and the losses tried beside the paper's).
DRAFTER_DESCRIPTIONS = {"heads": "reused LM heads (i)", "medusa": "Medusa heads, cross-entropy (ii)",
                        "medusa-tv": "Medusa heads, total variation (1 - acceptance)",
                        "offsets-ce": "position-aware offsets, cross-entropy (iii, the paper's loss)",
                        "offsets-kl": "position-aware offsets, KL to the warped verifier",
                        "offsets-tv": "position-aware offsets, total variation (1 - acceptance)"}
#: The decoders every drafter is measured with: the chain windows 2..8 (sampled drafts) and the small fixed tree of
#: top-ranked drafts, by their names in the grammar (no drafter qualifier: the drafter is passed beside them).
EVAL_DECODERS = tuple(f"chain:{w}" for w in CHAIN_WINDOWS) + (f"tree:{format_paths(DEFAULT_TREE)}",)
#: The chain window whose gain over the reused heads :func:`margin_rows` reports in tokens per call.
MARGIN_CHAIN = 4
#: Relative shortfall from the best window still counted as saturated (:func:`chain_window_rows`).
SATURATION_TOLERANCE = 0.02


def drafter_family(label: str) -> str:
    """The drafter a label trains (``offsets-tv`` -> ``offsets``, ``medusa-tv`` -> ``medusa``, ``heads`` -> ``heads``):
    the part before the loss suffix."""
    return str(label).split("-", 1)[0]


def evaluate_drafters(code_predictor, drafters: Mapping[str, object], frames: Frames, *,
                      decoders: Sequence[str] = EVAL_DECODERS, sampling: Sampling | None = None, seed: int = 0,
                      progress: bool = False) -> dict[str, dict]:
    """Each drafter (``{label: drafter}``) under the same ``decoders`` on the same evaluation frames (the paper's Table
    2 measurement): names of chains and trees of rank paths without ``@DRAFTER``, each drafter drafting for them.

    Returns:
        ``{label: evaluate_acceptance(...)}`` (tokens per call measured and predicted by decoder label, the decoders'
        fields, the exact tables).
    Raises:
        ValueError: no drafter; a decoder name that is not a chain or a tree of rank paths, or names a drafter.
    """
    if not drafters:
        raise ValueError("no drafter to evaluate: pass {'heads': ReusedHeads(), ...}")
    named = [resolve(n, None) for n in decoders]
    bad = [nd.label for nd in named if nd.name.kind not in ("chain", "tree") or nd.name.drafter != "heads"]
    if bad:
        raise ValueError(f"decoders {bad}: give chains or trees of rank paths without @DRAFTER (each drafter in "
                         "`drafters` drafts for them); calibrated trees are own_tree_rows' job")
    out = {}
    for label in progress_bar(list(drafters), desc="evaluating drafters", unit="drafter", enabled=progress):
        out[label] = A.evaluate_acceptance(code_predictor, drafters[label], frames,
                                           decoders=[nd.decoder for nd in named], sampling=sampling, seed=seed)
    return out


def calibrate_drafters(code_predictor, drafters: Mapping[str, object], frames: Frames, *,
                       sampling: Sampling | None = None, budgets: Sequence[int] = (PAPER_BUDGET,), seed: int = 0,
                       draws: int = 2, progress: bool = False) -> dict[str, dict]:
    """Each drafter's own calibrated trees (:func:`rvqspec_lib.eval.calibration.calibrate`: a tree is calibrated FOR the
    drafter whose ranks it holds) on calibration frames, at ``budgets`` and the paper's N = 32.

    Returns:
        ``{label: calibration dict}`` (the format :func:`rvqspec_lib.models.tree_files.save_calibration` writes).
    """
    budgets = sorted({int(b) for b in budgets} | {PAPER_BUDGET})
    return {label: calibrate(code_predictor, drafters[label], frames, sampling=sampling, budgets=budgets, seed=seed,
                             draws=draws)
            for label in progress_bar(list(drafters), desc="calibrating each drafter's trees", unit="drafter",
                                      enabled=progress)}


def own_tree_name(label: str, budget: int) -> str:
    """The grammar name of a drafter's own calibrated point-mass tree of ``budget`` nodes:
    ``tree:calibrated-point-mass:32`` (the heads), ``tree:calibrated-point-mass:32@offsets-kl``. Never ``paper:N``,
    which names the offsets shipped beside the model with their shipped tree, not a drafter trained in a notebook."""
    return f"tree:calibrated-point-mass:{int(budget)}" + ("" if label == "heads" else f"@{label}")


def own_tree_rows(code_predictor, drafters: Mapping[str, object], calibrations: Mapping[str, dict], frames: Frames,
                  *, budgets: Sequence[int] = (PAPER_BUDGET,),
                  sampling: Sampling | None = None, seed: int = 0, progress: bool = False) -> list[dict]:
    """Each drafter decoded with its OWN calibrated point-mass tree (the paper's setting) on the evaluation ``frames``
    at each of ``budgets``, beside its calibration's predictions; each tree is named by :func:`own_tree_name`.

    Returns:
        one row per (drafter, budget): the decoder's fields with ``drafter`` the label, ``tokens_per_call`` (measured),
        ``predicted`` (E(N) of that tree) and ``predicted_sampled`` (E(N) of its calibrated sampled tree of N nodes).
    Raises:
        ValueError: a drafter without calibration, a budget it does not hold.
    """
    missing = [lab for lab in drafters if lab not in calibrations]
    if missing:
        raise ValueError(f"no calibration for {missing}: calibrate_drafters first")
    trained = {lab: d for lab, d in drafters.items() if lab != "heads"}
    rows = []
    for label in progress_bar(list(drafters), desc="each drafter's own tree", unit="drafter", enabled=progress):
        cal = calibrations[label]
        for n in budgets:
            nd = resolve(own_tree_name(label, n), None, calibrations=calibrations, drafters=trained)
            st = A.decoder_statistics(code_predictor, nd.drafter, frames.context, nd.decoder, sampling=sampling,
                                      seed=seed)
            rows.append({**nd.fields(), "drafter": label, "tokens_per_call": st["tokens_per_call"],
                         "predicted": cal["point-mass"]["predicted_tokens_per_call"][str(n)],
                         "predicted_sampled": cal["sampled"]["predicted_tokens_per_call"][str(n)]})
    return rows


def predicted_by_budget(calibrations: Mapping[str, dict]) -> list[dict]:
    """The calibrations' predicted tokens per call E(N) at every calibrated budget, both kinds of tree: one row per
    (drafter, kind, N) with ``drafter``, ``kind`` (``point-mass`` or ``sampled``), ``nodes`` and ``predicted``."""
    return [{"drafter": lab, "kind": kind, "nodes": int(n), "predicted": cal[kind]["predicted_tokens_per_call"][str(n)]}
            for lab, cal in calibrations.items() for kind in ("point-mass", "sampled") for n in cal["budgets"]]


def _kept(drafter, key: str):
    return (getattr(drafter, "provenance", None) or {}).get(key)


def table2(results: Mapping[str, dict], own_rows: Sequence[dict], calibrations: Mapping[str, dict],
           drafters: Mapping[str, object], *, params_code_predictor: int, params_model: int, K: int) -> list[dict]:
    """The paper's Table 2 here, a row per drafter: tokens per call against the parameters it adds, from
    :func:`evaluate_drafters`, :func:`own_tree_rows` (N = 32 at least) and :func:`calibrate_drafters`; ``loss``,
    ``kept_epoch``, ``lr`` from the drafters' provenance; ``K`` and :data:`RELEASED_06B_CONFIG` give the counts at the
    paper's size.

    Returns:
        rows: ``drafter`` (a description), ``label``, ``decoder``, ``tree_N32_tokens_per_call``, ``tree_N32_predicted``,
        ``sampled_tree_N32_predicted``, ``best_N`` (the budget of highest predicted E(N)), ``tree_bestN_predicted``,
        ``chain_best``, ``chain_best_window``, ``chain4_tokens_per_call``, ``small_tree_tokens_per_call``,
        ``added_params``, ``pct_code_predictor``, ``pct_model``, ``added_params_at_0.6B``, ``loss``, ``kept_epoch``,
        ``lr``, and the quoted ``paper: toks/step (N 32 tree)``, ``paper: added params``.
    Raises:
        ValueError: a drafter missing from ``results``, ``calibrations`` or ``own_rows`` at N = 32.
    """
    own = {(r["drafter"], r["nodes"]): r for r in own_rows}
    missing = [lab for lab in drafters if lab not in results or lab not in calibrations
               or (lab, PAPER_BUDGET) not in own]
    if missing:
        raise ValueError(f"no results for {missing}: run evaluate_drafters, calibrate_drafters and own_tree_rows (at "
                         f"N = {PAPER_BUDGET}) on every drafter")
    small_tree = EVAL_DECODERS[-1]
    rows = []
    for label, d in drafters.items():
        r = results[label]
        chains = {v["nodes"]: v["tokens_per_call"] for v in r["decoders"].values() if v["kind"] == "chain"}
        w_best = max(chains, key=lambda w: (chains[w], -w))
        n32, cal = own[(label, PAPER_BUDGET)], calibrations[label]
        n_best = best_budget(cal)
        added = int(r["params_added"])
        rows.append({"drafter": DRAFTER_DESCRIPTIONS.get(label, label), "label": label, "decoder": n32["decoder"],
                     "tree_N32_tokens_per_call": n32["tokens_per_call"], "tree_N32_predicted": n32["predicted"],
                     "sampled_tree_N32_predicted": n32["predicted_sampled"], "best_N": n_best,
                     "tree_bestN_predicted": cal["point-mass"]["predicted_tokens_per_call"][str(n_best)],
                     "chain_best": chains[w_best], "chain_best_window": w_best,
                     "chain4_tokens_per_call": chains.get(MARGIN_CHAIN),
                     "small_tree_tokens_per_call": r["tokens_per_call"].get(small_tree), "added_params": added,
                     "pct_code_predictor": 100 * added / params_code_predictor, "pct_model": 100 * added / params_model,
                     "added_params_at_0.6B": params_added_for_config(drafter_family(label), RELEASED_06B_CONFIG, K=K),
                     "loss": _kept(d, "loss"), "kept_epoch": _kept(d, "best_epoch"), "lr": _kept(d, "lr"),
                     "paper: toks/step (N 32 tree)": PAPER_TOKS_PER_STEP.get(label),
                     "paper: added params": PAPER_PARAMS_ADDED.get(label)})
    return rows


def margin_rows(code_predictor, drafters: Mapping[str, object], frames: Frames, *, n_ahead: int = 3,
                sampling: Sampling | None = None, results: Mapping[str, dict] | None = None) -> list[dict]:
    """Each drafter against the reused heads (the baseline, ``heads``) on the same frames
    (:func:`paired_acceptance_difference`: exact acceptance over offsets j <= ``n_ahead``,
    a Student t interval over utterances); with ``results`` also its gain in tokens per call of ``chain:4``.

    Returns:
        one row per drafter but the baseline: ``drafter``, ``acceptance_heads``, ``acceptance_drafter``,
        ``difference``, ``ci95_low``, ``ci95_high``, ``p_value``, ``n_utterances``, ``n_frames``, ``difference_t1`` ..,
        ``chain4_gain``.
    Raises:
        ValueError: ``baseline`` not among the drafters; fewer than 2 utterances.
    """
    if "heads" not in drafters:
        raise ValueError(f"the baseline 'heads' is not among the drafters {list(drafters)}")
    rows = []
    for label, d in drafters.items():
        if label == "heads":
            continue
        m = paired_acceptance_difference(code_predictor, drafters["heads"], d, frames, n_ahead=n_ahead,
                                           sampling=sampling)
        row = {"drafter": label, "acceptance_heads": m["mean_a"], "acceptance_drafter": m["mean_b"],
               "difference": m["difference"], "ci95_low": m["ci_low"], "ci95_high": m["ci_high"],
               "p_value": m["p_value"], "n_utterances": m["n_utterances"], "n_frames": m["n_frames"],
               **{f"difference_t{j + 1}": v for j, v in enumerate(m["difference_by_offset"])}}
        if results is not None:
            key = f"chain:{MARGIN_CHAIN}"
            row[f"chain{MARGIN_CHAIN}_gain"] = (results[label]["tokens_per_call"][key]
                                                - results["heads"]["tokens_per_call"][key])
        rows.append(row)
    return rows


def headroom_rows(code_predictor, drafters: Mapping[str, object], frames: Frames, *, n_frames: int, samples: int,
                  n_ahead: int = 3, sampling: Sampling | None = None, seed: int = 0) -> tuple[dict, list[dict]]:
    """The headroom of drafters that see only H_k (:func:`paper.headroom.drafter_headroom`) on
    ``n_frames`` frames picked at random (seeded) from ``frames``, and its table
    (:func:`paper.headroom.headroom_table`: per offset, the ceiling, the marginal, each drafter and the
    share of the marginal's gain over the reused heads it captures).

    Returns:
        ``(headroom dict, rows)``.
    """
    n = min(len(frames), int(n_frames))
    pick = torch.randperm(len(frames), generator=torch.Generator().manual_seed(seed))[:n]
    hr = H.drafter_headroom(code_predictor, frames.context[pick], frames.codes[pick], dict(drafters), n_ahead=n_ahead,
                            samples=samples, sampling=sampling, generator=torch.Generator().manual_seed(seed))
    return hr, H.headroom_table(hr)


def acceptance_tables(results: Mapping[str, dict], *, K: int) -> dict[str, list[dict]]:
    """Exact acceptance of each drafter, from :func:`evaluate_drafters`' tables (the paper's Figure 3 here).

    Returns:
        ``{"by_depth": rows, "by_offset": rows, "rank": rows}``: ``by_depth``, one row per drafted depth d = 2..n
        (``depth``, then one column per drafter: the acceptance of a sampled draft of depth d, offsets j <= K
        pooled); ``by_offset``, one row per draft offset t (``offset_t``, one column per drafter, start depths
        pooled; past K every drafter uses the reused head); ``rank``, one row per (drafter, offset j <= K):
        ``sampled`` (the acceptance of a sampled draft), ``rank0`` .. (the target mass E[p(x_r)] of the draft's
        rank-r code: the chance a point-mass draft of rank r is kept) and ``top_ranks_total``.
    """
    labels = list(results)
    first = results[labels[0]]
    n = int(first["n_codes"])
    by_depth = [{"depth": d} for d in range(2, n + 1)]
    by_offset = [{"offset_t": j + 1} for j in range(len(first["exact"]["alpha_by_offset"]))]
    rank = []
    for lab in labels:
        ex = results[lab]["exact"]
        depth = A.acceptance_by_depth(ex["alpha"], max_offset=K)
        for row in by_depth:
            row[lab] = None if math.isnan(depth[row["depth"]]) else float(depth[row["depth"]])
        for row, v in zip(by_offset, ex["alpha_by_offset"]):
            row[lab] = v
        mass = np.array(ex["rank_mass_by_offset"], dtype=np.float64)  # (K_eval, R), None read as NaN
        for j in range(min(K, mass.shape[0])):
            rank.append({"drafter": lab, "offset_t": j + 1, "sampled": ex["alpha_by_offset"][j],
                         **{f"rank{r}": float(mass[j, r]) for r in range(mass.shape[1])},
                         "top_ranks_total": float(np.nansum(mass[j]))})
    return {"by_depth": by_depth, "by_offset": by_offset, "rank": rank}


def chain_window_rows(results: Mapping[str, dict]) -> tuple[list[dict], dict[str, int]]:
    """The chain with sampled drafts across windows, per drafter (TensorRT-Edge-LLM's ``--cpSpecVerifySize``):
    measured and predicted tokens per call, found by the decoders' fields (``kind`` chain, ``nodes`` the window),
    and the saturation window (:func:`paper.notebook_measures.saturation_window` at :data:`SATURATION_TOLERANCE`).

    Returns:
        ``(rows, saturation)``: rows ``drafter``, ``decoder`` (its label), ``window``, ``tokens_per_call``,
        ``predicted``; ``saturation`` ``{label: window}``.
    """
    rows, saturation = [], {}
    for lab, r in results.items():
        saturation[lab] = saturation_window(r, rel_tol=SATURATION_TOLERANCE)
        chains = sorted((v for v in r["decoders"].values() if v["kind"] == "chain"), key=lambda v: v["nodes"])
        rows += [{"drafter": lab, "decoder": v["decoder"], "window": v["nodes"],
                  "tokens_per_call": v["tokens_per_call"],
                  "predicted": r["predicted_tokens_per_call"][v["decoder"]]} for v in chains]
    return rows, saturation


def best_by(rows: Sequence[dict], column: str) -> str:
    """The ``label`` of the row with the largest ``column`` (ties: the first), e.g. the drafter with the most tokens
    per call in :func:`table2`'s rows."""
    return max(rows, key=lambda r: (r[column] if r[column] is not None else -math.inf))["label"]


def paired_acceptance_difference(code_predictor, drafter_a, drafter_b, frames: Frames, *, n_ahead: int = 3,
                                 sampling: Sampling | None = None) -> dict:
    """Is drafter B's acceptance higher than drafter A's? Per frame the exact acceptance (:func:`frame_acceptance`)
    averaged over every (k, j) with k + j <= n; the difference B - A averaged within each utterance; a 95% Student t
    interval (and the paired t-test's p-value) over UTTERANCES, the independent units (``frames.utterance``). No
    sampling noise: the interval only reflects which frames were drawn.

    Returns:
        ``{"mean_a", "mean_b", "difference", "ci_low", "ci_high", "confidence", "p_value", "n_frames",
        "n_utterances", "difference_by_offset" [n_ahead floats]}``.
    Raises:
        ValueError: fewer than 2 utterances.
    """
    from scipy import stats  # local: scipy.stats takes about 1 s to import (measured); only this needs it

    confidence = 0.95
    utt = frames.utterance
    ids = torch.unique(utt)
    if ids.numel() < 2:
        raise ValueError("a paired interval over utterances needs frames of at least 2 utterances")
    a, b = A.frame_acceptance(code_predictor, [drafter_a, drafter_b], frames.context, frames.codes, n_ahead=n_ahead,
                            sampling=sampling)
    fa, fb = a.nanmean((1, 2)), b.nanmean((1, 2))  # (N,)
    per_utt = torch.stack([(fb - fa)[utt == u].mean() for u in ids]).numpy()
    m = len(per_utt)
    mean = float(per_utt.mean())
    se = float(per_utt.std(ddof=1) / np.sqrt(m))
    if se > 0:
        half = float(stats.t.ppf(0.5 + confidence / 2, m - 1)) * se
        p_value = float(2 * stats.t.sf(abs(mean) / se, m - 1))
    else:
        half, p_value = 0.0, (1.0 if mean == 0 else 0.0)
    return {"mean_a": float(fa.mean()), "mean_b": float(fb.mean()), "difference": mean, "ci_low": mean - half,
            "ci_high": mean + half, "confidence": confidence, "p_value": p_value, "n_frames": int(len(fa)),
            "n_utterances": m, "difference_by_offset": (b - a).nanmean((0, 1)).tolist()}


def best_budget(calibration: dict) -> int:
    """The calibrated node budget N with the highest PREDICTED tokens per call E(N) of the point-mass tree; ties go to
    the smaller N. E(N) of a greedy tree never falls as N grows, so this is the largest budget unless the gain stops:
    speed is another question (notebook 04)."""
    pred = calibration["point-mass"]["predicted_tokens_per_call"]
    return max(sorted(int(b) for b in calibration["budgets"]), key=lambda b: (pred[str(b)], -b))
