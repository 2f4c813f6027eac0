"""Calibrating draft trees from data (paper §2.2 "calibrated sparse tree"; docs/methods.md#building-a-tree): the best
point-mass and sampled tree of every node budget from acceptance tables of calibration frames, each with its predicted
tokens per call (:func:`predicted`; notebook 04 checks it against the measured one)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from rvqspec_lib.eval.acceptance import (
    _drafts_and_targets,
    _json,
    _teacher_forced_batches,
    _valid,
    exact_statistics,
    predicted_tokens_per_call,
)
from rvqspec_lib.data.frame_sources import frames_from_contexts, frames_from_shipped
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding import verify as rules
from rvqspec_lib.decoding.decoders import Tree
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.decoding.trees import expected_tokens, grow_tree

#: Node budgets N (query positions of a verify call, the root included) the calibration builds a tree for.
BUDGETS = tuple(range(2, 65))
#: The two kinds of calibrated tree: top-ranked (point-mass) children, and children sampled without replacement.
KINDS = ("point-mass", "sampled")
FORMAT = "rvqspec-trees"
FORMAT_VERSION = 1


@torch.no_grad()
def sampled_child_acceptance(code_predictor, drafter, context: torch.Tensor, codes: torch.Tensor, *,
                             n_ahead: int, max_children: int, sampling: Sampling | None = None, draws: int = 2,
                             seed: int = 0, batch_size: int = 16) -> np.ndarray:
    """Per (start depth s, offset t, child index i) acceptance of children sampled from q without replacement: for each
    frame and s, ``max_children`` children of the draft q from H_s are drawn (Gumbel-top-k, as the decoder draws them)
    and walked with the decoder's own rule against the target p of depth s+t; child i is reached with probability
    ``prod_{j<i} (1 - r_j)`` and accepted with ``r_i``, and ``reach_i * r_i`` averaged over frames and ``draws``
    estimates the table (child 0's entry is ``sum min(p, q)`` in expectation).

    Args:
        context: ``(N, 2, talker_hidden)``. codes: ``(N, n)`` codes 1..n, samples of p given the context.
    Returns:
        ``(n-1, n_ahead, max_children)`` float64, NaN where s + t > n.
    """
    sampling = Sampling() if sampling is None else sampling
    cp = code_predictor
    n = P.n_codes(cp)
    gen = torch.Generator().manual_seed(seed)
    total = torch.zeros(n - 1, n_ahead, max_children, dtype=torch.float64)
    count = 0
    for _, _, hidden, p_all in _teacher_forced_batches(cp, context, codes, sampling, batch_size):
        logits, _, _, p = _drafts_and_targets(cp, drafter, hidden, p_all, n_ahead)  # (B, n-1, K, V)
        q = sampling.probs(logits).cpu()
        p = p.cpu()
        shape, v = q.shape[:-1], q.shape[-1]
        qf, pf = q.reshape(-1, v), p.reshape(-1, v)
        for _ in range(draws):
            u = torch.rand(qf.shape, generator=gen)
            keys = torch.log(qf) - torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
            top = torch.topk(keys, max_children, dim=-1)
            resid, qi = pf.clone(), qf.clone()
            reach = torch.ones(qf.shape[0], dtype=torch.float64)
            for i in range(max_children):
                x, exists = top.indices[:, i], torch.isfinite(top.values[:, i])
                qn = qi / qi.sum(-1, keepdim=True).clamp_min(1e-30)
                r = rules.acceptance_ratio(resid, x, qn.gather(1, x[:, None]).squeeze(1))
                r = torch.where(exists, r, torch.zeros_like(r)).double()
                total[..., i] += (reach * r).reshape(shape).sum(0)
                reach = reach * (1.0 - r)
                resid = torch.where(exists[:, None], rules.residual(resid, x, qn), resid)
                qi = qi.scatter(1, x[:, None], 0.0)
        count += hidden.shape[0] * draws
    out = torch.where(_valid(n, n_ahead)[..., None], total / max(count, 1), torch.tensor(float("nan"), dtype=torch.float64))
    return out.numpy()


def pool_by_offset(table: np.ndarray) -> np.ndarray:
    """``(n-1, K, C)`` per start depth -> ``(K, C)``: the unweighted mean over the start depths where offset t
    exists (every start depth is met once per frame by a walk over it; NaN entries skipped)."""
    with np.errstate(invalid="ignore"):
        out = np.nanmean(np.asarray(table, dtype=np.float64), axis=0)
    return np.nan_to_num(np.clip(out, 0.0, 1.0), nan=0.0)


@torch.no_grad()
def calibrate(code_predictor, drafter, frames: Frames, *, sampling: Sampling | None = None,
              budgets: Sequence[int] = BUDGETS, max_offset: int | None = None, max_rank: int = 16,
              max_children: int = 8, draws: int = 2, seed: int = 0, batch_size: int = 16) -> dict:
    """Point-mass and sampled trees of every node budget N in ``budgets`` (2..64, root included), calibrated for
    ``drafter`` on calibration ``frames`` (codes: samples of p); ``max_offset`` default ``n_codes - 1``; ``max_rank``
    and ``max_children`` the ranks and sampled children tabulated; ``draws``, ``seed`` the sampled children's.

    Returns:
        JSON-able dict: ``format``, ``version``, ``n_codes``, ``codebook_size``, ``drafter``, ``sampling``,
        ``n_frames``, ``budgets``, and per kind (``"point-mass"``, ``"sampled"``): ``table`` (pooled ``(K, C)``),
        ``order`` (greedy: the tree of budget N is the first N - 1), ``predicted_tokens_per_call`` ``{N: E(N)}`` over
        whole frames, ``call_expected_tokens`` ``{N: 1 + sum of node values}`` (one call, frame end ignored);
        ``best_kind`` ``{N: kind}`` (the larger E(N)).
    Raises:
        ValueError: a budget outside 2..64, an empty frame set.
    """
    sampling = Sampling() if sampling is None else sampling
    budgets = sorted({int(b) for b in budgets})
    if not budgets or budgets[0] < 2 or budgets[-1] > 64:
        raise ValueError(f"node budgets must lie in 2..64 (the root plus 1..63 drafts), got {budgets}")
    if len(frames) == 0:
        raise ValueError("no calibration frames")
    cp = code_predictor
    n = P.n_codes(cp)
    k = n - 1 if max_offset is None else max(1, min(int(max_offset), n - 1))
    vocab = int(cp.config.vocab_size)
    exact = exact_statistics(cp, drafter, frames.context, frames.codes, n_ahead=k, sampling=sampling,
                             max_rank=min(max_rank, vocab), batch_size=batch_size)
    exact["child_accept"] = sampled_child_acceptance(cp, drafter, frames.context, frames.codes, n_ahead=k,
                                                     max_children=min(max_children, vocab), sampling=sampling,
                                                     draws=draws, seed=seed, batch_size=batch_size)
    out = {"format": FORMAT, "version": FORMAT_VERSION, "n_codes": n, "codebook_size": vocab,
           "drafter": getattr(drafter, "name", type(drafter).__name__), "sampling": sampling.describe(),
           "n_frames": len(frames), "source": dict(frames.source), "budgets": budgets,
           "alpha_by_offset": _json(exact["alpha_by_offset"])}
    for kind, table in (("point-mass", exact["rank_mass"]), ("sampled", exact["child_accept"])):
        pooled = pool_by_offset(table)
        paths = grow_tree(pooled, budgets[-1] - 1, sampled=kind == "sampled")
        e_frame, e_call = {}, {}
        for b in budgets:
            sub = paths[: b - 1]  # greedy: the tree of budget b is the first b - 1 nodes added
            e_call[str(b)] = expected_tokens(sub, pooled)
            e_frame[str(b)] = predicted_tokens_per_call(exact, Tree(sub, sampled=kind == "sampled"), n)
        out[kind] = {"table": _json(pooled), "by_start_depth": _json(table), "order": [list(x) for x in paths],
                     "predicted_tokens_per_call": e_frame, "call_expected_tokens": e_call}
    out["best_kind"] = {str(b): max(KINDS, key=lambda kd: out[kd]["predicted_tokens_per_call"][str(b)])
                        for b in budgets}
    return out


def calibration_frames(lm, *, max_frames: int | None = None, seed: int = 0,
                       progress: bool = False) -> Frames:
    """Frames to calibrate on: the contexts of the model's shipped ``calibration`` split (teacher-forced on real
    speech), with codes 1..15 re-sampled from p by the inner loop itself (the codes a decoder will verify).
    The split is found from the loaded model's own folder (``lm.folder``).

    Raises:
        FileNotFoundError: the model ships no utterances. ValueError: no calibration split.
    """
    real = frames_from_shipped(lm, "calibration", max_frames=max_frames, seed=seed, progress=progress)
    out = frames_from_contexts(lm.code_predictor, real.context, seed=seed)
    out.utterance = real.utterance
    out.source = {**real.source, "codes": "re-sampled from p (AR, deployed sampling)", "seed": seed}
    return out


def tables_from_calibration(calibration: dict) -> dict:
    """The per-start-depth tables :func:`~rvqspec_lib.eval.acceptance.predicted_tokens_per_call` needs, from a
    calibration (:func:`calibrate`, or its file): ``alpha`` (the first sampled child = a chain's draft),
    ``rank_mass``, ``child_accept`` (float64 arrays ``(n-1, K, C)``, NaN where there is no node)."""
    ch = np.array(calibration["sampled"]["by_start_depth"], dtype=np.float64)  # numpy reads None as NaN
    return {"alpha": ch[..., 0], "rank_mass": np.array(calibration["point-mass"]["by_start_depth"], dtype=np.float64),
            "child_accept": ch}


def predicted(calibration: dict, name, decoder) -> float:
    """E(N), the tokens per call ``calibration`` (of the decoder's drafter) predicts for ``decoder`` over whole frames:
    calibrated trees and ``paper`` (by ``name``, a :class:`~rvqspec_lib.decoding.decoder_names.DecoderName`) read the
    stored prediction, AR 1, others :func:`~rvqspec_lib.eval.acceptance.predicted_tokens_per_call` of its tables.

    Raises:
        ValueError: tables that do not reach the decoder's offsets or ranks. KeyError: a budget not calibrated.
    """
    if name.kind == "ar":
        return 1.0
    if name.kind in ("calibrated", "paper"):
        return float(calibration[name.tree_kind]["predicted_tokens_per_call"][str(name.budget)])
    return float(predicted_tokens_per_call(tables_from_calibration(calibration), decoder,
                                           int(calibration["n_codes"])))

