"""The headroom of drafters that see only H_k: the best acceptance any such drafter could reach, measured by sampling
the frame's continuations from the verifier (notebook 03), and the share of it each drafter captures.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from rvqspec_lib.eval.acceptance import _teacher_forced_batches
from rvqspec_lib.data.teacher import teacher_forced_hidden
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.drafters import draft_batch
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.decoding.sampling import sample as draw


def optimal_overlap(p: torch.Tensor) -> torch.Tensor:
    """``max_q (1/S) sum_s sum_x min(p_s(x), q(x))`` over distributions q, for each group of S targets ``p``
    ``(..., S, V)``: ``(...)`` float64 in [1/S, 1]. The objective is separable and concave in q (code x's slope is
    ``#{s: p_s(x) > q(x)} / S``), so filling q level by level from the smallest p_s(x) up is optimal.

    Raises:
        ValueError: fewer than 2 dimensions, negative entries, rows not summing to 1 (to 1e-4).
    """
    p = torch.as_tensor(p)
    if p.dim() < 2 or p.shape[-1] < 1 or p.shape[-2] < 1:
        raise ValueError(f"p must be (..., S, V) with S, V >= 1 (S distributions over V codes), got {tuple(p.shape)}")
    sums = p.double().sum(-1)
    if bool((p < 0).any()) or not bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-4)):
        raise ValueError("every row of p must be a distribution (non-negative, summing to 1): pass probabilities, "
                         "e.g. Sampling().probs(logits), not logits")
    s = p.shape[-2]
    srt = torch.sort(p.double(), dim=-2).values  # (..., S, V) ascending over samples
    step = torch.diff(srt, dim=-2, prepend=torch.zeros_like(srt[..., :1, :]))  # level i adds sorted_i - sorted_{i-1}
    level_mass = step.sum(-1)  # (..., S): mass that level i can take
    slope = (s - torch.arange(s, dtype=torch.float64)) / s  # (S,) level i's slope
    before = torch.cumsum(level_mass, -1) - level_mass
    take = (1.0 - before).clamp(min=0.0).minimum(level_mass)  # mass put at each level
    return (take * slope).sum(-1)


@torch.no_grad()
def drafter_headroom(code_predictor, context: torch.Tensor, codes: torch.Tensor, drafters: Mapping | None = None, *,
                     n_ahead: int = 3, samples: int = 8, sampling: Sampling | None = None,
                     generator: torch.Generator | None = None) -> dict:
    """How much acceptance ANY drafter that sees only H_k could gain, by Monte Carlo: ``samples`` (even, >= 2)
    continuations from the verifier per frame and start depth k give the p_s of depth k+j; a q scores
    ``(1/S) sum_s sum_x min(p_s(x), q(x))``. By offset: ``ceiling`` (the best q, :func:`optimal_overlap`: an upper
    bound), ``marginal`` (the mean p_s of half the samples, scored on the other half: achievable), each drafter's.
    ``context`` ``(N, 2, talker_hidden)`` with ``codes`` ``(N, n)`` (codes 1..n teacher-forced before each start
    depth); ``drafters`` ``{label: drafter}``; ``generator`` default seeded 0.

    Returns:
        ``{"offsets", "ceiling", "marginal", "drafters": {name: [...]}, "samples", "n_frames"}`` (by offset).
    Raises:
        ValueError: ``samples`` odd or < 2, ``n_ahead`` outside [1, n-1], mismatched shapes, codes outside the
            codebook, a non-drafter.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 2 or samples % 2:
        raise ValueError(f"samples must be even and >= 2 (half fit the marginal, half score it), got {samples}")
    cp = code_predictor
    n = P.n_codes(cp)
    if not 1 <= n_ahead <= n - 1:
        raise ValueError(f"n_ahead must be in [1, {n - 1}], got {n_ahead}")
    codes = torch.as_tensor(codes)
    vocab = int(cp.config.vocab_size)
    if codes.dim() != 2 or codes.shape != (context.shape[0], n) or context.dim() != 3:
        raise ValueError(f"need context (N, 2, hidden) and codes (N, {n}) for the same N frames, got "
                         f"{tuple(context.shape)} and {tuple(codes.shape)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= vocab):
        raise ValueError(f"codes must lie in [0, {vocab}), got [{int(codes.min())}, {int(codes.max())}]")
    drafters = dict(drafters or {})
    bad = [k for k, d in drafters.items() if not hasattr(d, "draft_logits")]
    if bad:
        raise ValueError(f"drafters {bad} are not drafters (objects with draft_logits): build them with "
                         "rvqspec_lib.models.drafter_files.make_drafter")
    sampling = Sampling() if sampling is None else sampling
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    names, drafters = [str(k) for k in drafters], list(drafters.values())
    sums = {key: torch.zeros(n_ahead, dtype=torch.float64) for key in ["ceiling", "marginal", *names]}
    count = torch.zeros(n_ahead, dtype=torch.float64)
    ks = torch.arange(1, n)  # start depths
    for ctx, cod, hidden, p_true in _teacher_forced_batches(cp, context, codes, sampling, 16):
        b = ctx.shape[0]
        # one row per (frame, start depth k, sample): the frame's codes, continuations written in place
        rows = b * (n - 1) * samples
        f_idx = torch.arange(b).repeat_interleave((n - 1) * samples)
        k_idx = ks.repeat_interleave(samples).repeat(b)  # (rows,)
        seq = cod[f_idx].clone()
        ctx_rows = ctx[f_idx]
        p_next = p_true[f_idx, k_idx - 1]  # p of depth k given the true prefix
        targets = []  # p_s of depth k+j, j = 1..n_ahead: (rows, V) each
        for j in range(n_ahead):
            d = (k_idx + j).clamp(max=n)  # depth being sampled (1-based)
            live = (k_idx + j) <= n
            x = draw(p_next.float(), gen).to(seq.device)
            seq[torch.arange(rows), d - 1] = torch.where(live, x, seq[torch.arange(rows), d - 1])
            h = teacher_forced_hidden(cp, ctx_rows, seq)  # (rows, n, H)
            nd = (k_idx + j + 1).clamp(max=n)  # the next depth
            p_next = sampling.probs(P.head_logits(cp, h[torch.arange(rows), nd - 1], nd - 1))
            targets.append(p_next)
        p_s = torch.stack(targets, 1).reshape(b, n - 1, samples, n_ahead, -1).transpose(2, 3)  # (b, n-1, K, S, V)
        valid = (ks[:, None] + torch.arange(1, n_ahead + 1)[None]) <= n  # (n-1, K)
        w = valid.double()
        sums["ceiling"] += (optimal_overlap(p_s) * w).sum((0, 1)).cpu()
        half = samples // 2
        q_m = p_s[..., :half, :].mean(-2, keepdim=True)
        sums["marginal"] += (torch.minimum(p_s[..., half:, :], q_m).sum(-1).double().mean(-1) * w).sum((0, 1)).cpu()
        for name, dr in zip(names, drafters):
            logits, _, _ = draft_batch(dr, cp, hidden, n_ahead)  # (b, n-1, K, V), from H_k
            q = sampling.probs(logits)[..., None, :]
            sums[name] += (torch.minimum(p_s, q).sum(-1).double().mean(-1) * w).sum((0, 1)).cpu()
        count += w.sum(0) * b
    out = {key: (v / count.clamp_min(1)).tolist() for key, v in sums.items()}
    return {"offsets": list(range(1, n_ahead + 1)), "ceiling": out["ceiling"], "marginal": out["marginal"],
            "drafters": {name: out[name] for name in names}, "samples": samples, "n_frames": int(context.shape[0])}


def captured_share(drafter, heads, marginal):
    """The share of the achievable gain a drafter realises, ``(drafter - heads) / (marginal - heads)`` (0: none over
    the reused heads; 1: all an H_k-only drafter could get; NaN where ``marginal <= heads``), for floats or
    equal-length sequences: a float64 ndarray.

    Raises:
        ValueError: shapes that do not broadcast.
    """
    d, h, m = (np.asarray(v, dtype=np.float64) for v in (drafter, heads, marginal))
    try:
        d, h, m = np.broadcast_arrays(d, h, m)
    except ValueError:
        raise ValueError(f"drafter, heads and marginal must have the same length, got {d.shape}, {h.shape}, "
                         f"{m.shape}") from None
    gain = m - h
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(gain > 0, (d - h) / np.where(gain > 0, gain, 1.0), np.nan)


def headroom_table(headroom: dict, baseline: str = "heads") -> list[dict]:
    """:func:`drafter_headroom`'s result as one row per offset t: ``offset_t``, ``ceiling``, ``marginal``, each
    drafter's acceptance, and ``<label>_captured`` (:func:`captured_share` against ``baseline``) for the others.

    Raises:
        ValueError: ``baseline`` is not among the headroom's drafters.
    """
    accs = headroom["drafters"]
    if baseline not in accs:
        raise ValueError(f"the baseline {baseline!r} is not among the headroom's drafters {list(accs)}: pass "
                         f"drafters={{'{baseline}': ReusedHeads(), ...}} to drafter_headroom")
    shares = {lab: captured_share(acc, accs[baseline], headroom["marginal"]) for lab, acc in accs.items()
              if lab != baseline}
    rows = []
    for j, off in enumerate(headroom["offsets"]):
        row = {"offset_t": off, "ceiling": headroom["ceiling"][j], "marginal": headroom["marginal"][j]}
        for lab, acc in accs.items():
            row[lab] = acc[j]
            if lab != baseline:
                row[f"{lab}_captured"] = float(shares[lab][j])
        rows.append(row)
    return rows
