"""Acceptance statistics of a drafter under the deployed sampling (paper Table 2; the tree calibration's inputs;
docs/methods.md#expected-tokens-per-call): empirical, from decoded frames (:func:`decoder_statistics`), and exact, from
one teacher-forced pass (:func:`exact_statistics`), turned into expected tokens per call
(:func:`predicted_tokens_per_call`)."""

from __future__ import annotations

import math
import operator
from itertools import accumulate
from typing import Sequence

import numpy as np
import torch

from rvqspec_lib.data.frames import Frames
from rvqspec_lib.data.teacher import teacher_forced_hidden, verifier_logits
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decode import decode_frame
from rvqspec_lib.decoding.decoder_names import name_of
from rvqspec_lib.decoding.decoders import AR, CHAIN_WINDOWS, DEFAULT_TREE, Chain, Tree
from rvqspec_lib.decoding.drafters import draft_batch
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.decoding.trees import DraftTree

#: Ranks tabulated by default for the tree calibration (top-8 at every offset).
DEFAULT_MAX_RANK = 8


def _json(a: np.ndarray):
    """NaN -> None, nested lists (JSON has no NaN)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        return None if math.isnan(a.item()) else float(a.item())
    return [_json(v) for v in a]


def _valid(n: int, n_ahead: int) -> torch.Tensor:
    """``(n-1, n_ahead)`` bool: start depth k (row k-1) and offset j (column j-1) draft a depth k + j <= n."""
    return (torch.arange(1, n)[:, None] + torch.arange(1, n_ahead + 1)[None, :]) <= n


def _teacher_forced_batches(cp, context: torch.Tensor, codes: torch.Tensor, sampling: Sampling, batch_size: int):
    """Yield ``(context (B, 2, Ht), codes (B, n), hidden (B, n, H), p (B, n, V))`` batch by batch, on the code
    predictor's device: ONE teacher-forced pass of the code predictor and the warped verifier distribution of every
    depth, shared by every drafter evaluated on the batch."""
    dev = next(cp.parameters()).device
    for i in range(0, context.shape[0], batch_size):
        ctx, cod = context[i: i + batch_size].to(dev), codes[i: i + batch_size].to(dev)
        hidden = teacher_forced_hidden(cp, ctx, cod)
        yield ctx, cod, hidden, sampling.probs(verifier_logits(cp, hidden))


def _drafts_and_targets(cp, drafter, hidden: torch.Tensor, p_all: torch.Tensor, n_ahead: int):
    """The drafter's logits from every start depth and the verifier distribution of the depth each one drafts.

    Returns:
        ``(logits (B, n-1, K, V), f (B, n-1, K) frame index, dd (B, n-1, K) drafted depth - 1, p (B, n-1, K, V))``.
    """
    n = P.n_codes(cp)
    logits, d, _ = draft_batch(drafter, cp, hidden, n_ahead)
    f = torch.arange(hidden.shape[0], device=hidden.device)[:, None, None].expand_as(d)
    dd = (d - 1).clamp(max=n - 1)
    return logits, f, dd, p_all[f, dd]


@torch.no_grad()
def exact_statistics(code_predictor, drafter, context: torch.Tensor, codes: torch.Tensor, *, n_ahead: int = 3,
                     sampling: Sampling | None = None, max_rank: int = DEFAULT_MAX_RANK,
                     batch_size: int = 256) -> dict:
    """Acceptance tables computed from the probabilities, by teacher forcing ``codes``.

    Args:
        context: ``(N, 2, talker_hidden)``. codes: ``(N, n)`` codes 1..n, ideally samples of p (decoded frames).
        n_ahead: offsets j = 1..n_ahead tabulated. max_rank: ranks r = 0..max_rank-1 tabulated.
        sampling: the deployed warpers (default temperature 0.9, top-k 50) for p and q alike.

    Returns:
        numpy arrays (NaN where k + j > n): ``alpha`` ``(n-1, n_ahead)`` E[sum min(p, q)] by start depth k (row k-1)
        and offset j (column j-1); ``rank_mass`` / ``rank_hit`` ``(n-1, n_ahead, max_rank)``; ``alpha_by_offset``
        ``(n_ahead,)``, ``alpha_by_depth`` ``(n+1,)`` (index d = drafted depth, pairs with k + j = d pooled);
        ``rank_mass_by_offset`` / ``rank_hit_by_offset`` ``(n_ahead, max_rank)`` (start depths pooled);
        ``n_frames``.
    """
    sampling = Sampling() if sampling is None else sampling
    cp = code_predictor
    n = P.n_codes(cp)
    vocab = int(cp.config.vocab_size)
    r_max = min(max_rank, vocab)
    s_alpha = torch.zeros(n - 1, n_ahead, dtype=torch.float64)
    s_mass = torch.zeros(n - 1, n_ahead, r_max, dtype=torch.float64)
    s_hit = torch.zeros(n - 1, n_ahead, r_max, dtype=torch.float64)
    count = 0
    for _, cod, hidden, p_all in _teacher_forced_batches(cp, context, codes, sampling, batch_size):
        logits, f, dd, p = _drafts_and_targets(cp, drafter, hidden, p_all, n_ahead)  # (B, n-1, K, V)
        b = hidden.shape[0]
        alpha = torch.minimum(p, sampling.probs(logits)).sum(-1)  # (B, n-1, K)
        top = torch.topk(logits, r_max, dim=-1).indices  # (B, n-1, K, R)
        mass = p.gather(-1, top)
        hit = (top == cod[f, dd][..., None]).to(torch.float64)
        s_alpha += alpha.double().sum(0).cpu()
        s_mass += mass.double().sum(0).cpu()
        s_hit += hit.sum(0).cpu()
        count += b
    valid = _valid(n, n_ahead)  # (n-1, K)
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    alpha = torch.where(valid, s_alpha / count, nan)
    mass = torch.where(valid[..., None], s_mass / count, nan)
    hit = torch.where(valid[..., None], s_hit / count, nan)
    w = valid.double()
    pool = lambda t: torch.where(w.sum(0)[:, None] > 0, (torch.nan_to_num(t) * w[..., None]).sum(0)  # noqa: E731
                                 / w.sum(0).clamp_min(1)[:, None], nan)  # (K, R): start depths pooled
    return {"alpha": alpha.numpy(), "rank_mass": mass.numpy(), "rank_hit": hit.numpy(),
            "alpha_by_offset": pool(alpha[..., None])[:, 0].numpy(), "alpha_by_depth": acceptance_by_depth(alpha.numpy()),
            "rank_mass_by_offset": pool(mass).numpy(), "rank_hit_by_offset": pool(hit).numpy(), "n_frames": count}


@torch.no_grad()
def frame_acceptance(code_predictor, drafter, context: torch.Tensor, codes: torch.Tensor, *, n_ahead: int = 3,
                     sampling: Sampling | None = None) -> torch.Tensor:
    """Exact acceptance of a sampled draft frame by frame, ``alpha[i, k-1, j-1] = sum_x min(p(x), q(x))`` for the
    draft of depth k+j from H_k in frame i (what :func:`exact_statistics` averages), for one drafter or a list of them
    (then a list of tables from one teacher-forced pass).

    Returns:
        ``(N, n-1, n_ahead)`` float64, NaN where k + j > n.
    """
    sampling = Sampling() if sampling is None else sampling
    cp = code_predictor
    n = P.n_codes(cp)
    drafters = list(drafter) if isinstance(drafter, (list, tuple)) else [drafter]
    out: list[list[torch.Tensor]] = [[] for _ in drafters]
    for _, _, hidden, p_all in _teacher_forced_batches(cp, context, codes, sampling, 256):
        for acc, dr in zip(out, drafters):
            logits, _, _, p = _drafts_and_targets(cp, dr, hidden, p_all, n_ahead)
            acc.append(torch.minimum(p, sampling.probs(logits)).sum(-1).double().cpu())
    tables = [torch.where(_valid(n, n_ahead), torch.cat(acc), float("nan")) for acc in out]
    return tables if isinstance(drafter, (list, tuple)) else tables[0]


def _reach_tree(rank_mass: np.ndarray, tree: DraftTree, s: int, m: int) -> list[float]:
    out = []
    for i in range(1, m + 1):
        tot = 0.0
        for path in tree.paths:
            if len(path) == i:
                tot += math.prod(float(rank_mass[s - 1, t, r]) for t, r in enumerate(path))
        out.append(min(tot, out[-1] if out else 1.0))
    return out


def predicted_tokens_per_call(exact: dict, decoder, n_codes: int) -> float:
    """Expected tokens per call of ``decoder`` from :func:`exact_statistics` tables.

    Per call from start depth s: P(at least i drafts accepted) is prod_{j<=i} alpha[s, j] for a Chain, and the sum
    over tree nodes at offset i of the product of ``rank_mass`` (point-mass Tree) or ``child_accept`` (sampled Tree)
    along the node's path (offsets independent, the model the tree calibration uses); a call commits the accepted drafts plus one code unless the
    drafts reached the last depth. A dynamic programme over s gives the expected calls per frame (prefill included).

    Raises:
        ValueError: tables with fewer offsets or ranks than the decoder drafts.
    """
    n = n_codes
    if isinstance(decoder, AR):
        return 1.0
    tree = decoder.tree(n)
    k_max = tree.max_depth
    alpha = exact["alpha"]
    sampled_tree = isinstance(decoder, Tree) and decoder.sampled
    if sampled_tree and "child_accept" not in exact:
        raise ValueError("a sampled tree needs the per-child acceptance table 'child_accept' "
                         "(rvqspec_lib.eval.calibration.sampled_child_acceptance)")
    mass = exact["child_accept"] if sampled_tree else exact["rank_mass"]
    if alpha.shape[1] < k_max or (isinstance(decoder, Tree) and mass.shape[1] < k_max):
        raise ValueError(f"tables cover {min(alpha.shape[1], mass.shape[1])} offsets, the decoder drafts {k_max}")
    if isinstance(decoder, Tree) and mass.shape[2] <= tree.max_rank:
        raise ValueError(f"tables cover ranks < {mass.shape[2]}, the tree uses rank {tree.max_rank}")
    calls = [0.0] * (n + 1)  # calls[s]: expected calls to finish from last committed depth s
    for s in range(n - 1, 0, -1):
        m = min(k_max, n - s)
        reach = list(accumulate(map(float, alpha[s - 1, :m]), operator.mul)) if isinstance(decoder, Chain) else \
            _reach_tree(mass, tree, s, m)
        reach = [1.0] + reach + [0.0]
        e = 1.0
        for i in range(m + 1):
            p_i = reach[i] - reach[i + 1]
            c = i + 1 if s + i < n else i
            e += p_i * calls[min(n, s + c)]
        calls[s] = e
    return n / (1.0 + calls[1])


def acceptance_by_depth(alpha, max_offset: int | None = None) -> np.ndarray:
    """Acceptance by drafted depth d from a start-depth x offset table ``alpha`` ``(n-1, K)`` (row k-1, column j-1;
    NaN or ``None`` where no pair exists): the unweighted mean over k + j = d of offsets j <= ``max_offset`` (every
    start depth is equally likely in a frame).

    Returns:
        ``(n+1,)`` float64 indexed by d (NaN at d = 0, 1 and where no pair exists).
    Raises:
        ValueError: ``alpha`` not two-dimensional, or ``max_offset < 1``.
    """
    a = np.array(alpha, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"alpha must be (n-1, K), got shape {a.shape}")
    if max_offset is not None:
        if max_offset < 1:
            raise ValueError(f"max_offset must be >= 1, got {max_offset}")
        a = a[:, :max_offset]
    n = a.shape[0] + 1
    out = np.full(n + 1, np.nan)
    k = np.arange(1, n)[:, None]
    j = np.arange(1, a.shape[1] + 1)[None, :]
    for d in range(2, n + 1):
        vals = a[((k + j) == d) & ~np.isnan(a)]
        if vals.size:
            out[d] = vals.mean()
    return out


def _pad_cat(parts: list[torch.Tensor]) -> torch.Tensor:
    w = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, w - p.shape[1])) for p in parts])


@torch.no_grad()
def decoder_statistics(code_predictor, drafter, context: torch.Tensor, decoder, *, sampling: Sampling | None = None,
                       seed: int = 0) -> dict:
    """Run ``decoder`` over every context and count what its calls committed.

    Returns:
        dict with the decoder's fields (:meth:`~rvqspec_lib.decoding.decoder_names.DecoderName.fields` of
        :func:`~rvqspec_lib.decoding.decoder_names.name_of`: ``decoder`` its label, ``kind``, ``drafter``, ``nodes``,
        ``lossy``), ``tokens_per_call`` (all codes / all calls), ``calls_per_frame``, ``calls`` ``(N,)`` int64 (each
        context's calls, the prefill included), ``committed_hist`` (calls after
        the prefill that committed c = 1.. codes), ``acceptance_by_start_offset`` ``(n-1, K)`` (accepted / tried,
        NaN where never tried), ``acceptance_by_offset`` ``(K,)``, ``acceptance_by_depth`` ``(n+1,)`` (index =
        drafted depth), ``reach_by_offset`` ``(K,)`` (fraction of calls able to draft offset j that accepted at
        least j drafts), ``tried_by_offset`` / ``tried_by_start_offset`` (counts), and ``codes`` ``(N, n)`` (the
        committed codes, samples of p).
    """
    sampling = Sampling() if sampling is None else sampling
    cp = code_predictor
    n = P.n_codes(cp)
    dev = next(cp.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    outs = [decode_frame(cp, context[i: i + 256].to(dev), decoder=decoder, sampling=sampling, generator=gen,
                         drafter=drafter) for i in range(0, context.shape[0], 256)]  # batches of 256 contexts
    codes = torch.cat([o.codes for o in outs]).cpu()
    calls = torch.cat([o.calls for o in outs]).cpu()
    committed = _pad_cat([o.committed.cpu() for o in outs])[:, 1:]  # drop the prefill column
    accepted = _pad_cat([o.accepted.cpu() for o in outs])[:, 1:]
    start = _pad_cat([o.start_depth.cpu() for o in outs])[:, 1:]
    k_drafted = decoder.tree(n).max_depth  # 0 for AR: nothing is ever tried
    k_max = max(k_drafted, 1)
    live = committed > 0
    s, a = start[live], accepted[live]  # one entry per call after the prefill
    m = torch.clamp(n - s, max=k_drafted)  # drafts the call could make
    j = torch.arange(1, k_max + 1)[None, :]
    tried = (j <= torch.minimum(a + 1, m)[:, None])  # (calls, K)
    acc = j <= a[:, None]
    tried_sk = torch.zeros(n - 1, k_max, dtype=torch.float64)
    acc_sk = torch.zeros(n - 1, k_max, dtype=torch.float64)
    if s.numel():
        tried_sk.index_put_((s - 1,), tried.double(), accumulate=True)
        acc_sk.index_put_((s - 1,), acc.double(), accumulate=True)
    nan = float("nan")
    by_sk = torch.where(tried_sk > 0, acc_sk / tried_sk.clamp_min(1), torch.tensor(nan, dtype=torch.float64))
    t_j, a_j = tried_sk.sum(0), acc_sk.sum(0)
    by_j = torch.where(t_j > 0, a_j / t_j.clamp_min(1), torch.tensor(nan, dtype=torch.float64))
    depth = torch.arange(1, n)[:, None] + torch.arange(1, k_max + 1)[None, :]
    by_d = torch.full((n + 1,), nan, dtype=torch.float64)
    for dep in range(2, n + 1):
        sel = depth == dep
        if float(tried_sk[sel].sum()) > 0:
            by_d[dep] = acc_sk[sel].sum() / tried_sk[sel].sum()
    able = (m[:, None] >= j)
    reach = torch.where(able.sum(0) > 0, (acc & able).sum(0).double() / able.sum(0).clamp_min(1), nan)
    c = committed[live]
    hist = torch.bincount(c, minlength=k_max + 2)[1:].tolist() if c.numel() else []
    return {
        **name_of(decoder).fields(),
        "tokens_per_call": float(codes.shape[0] * n / calls.sum()),
        "calls_per_frame": float(calls.double().mean()),
        "calls": calls,
        "committed_hist": hist,
        "acceptance_by_start_offset": by_sk.numpy(),
        "acceptance_by_offset": by_j.numpy(),
        "acceptance_by_depth": by_d.numpy(),
        "reach_by_offset": reach.numpy(),
        "tried_by_offset": t_j.numpy(),
        "tried_by_start_offset": tried_sk.numpy(),
        "codes": codes,
    }


def evaluate_acceptance(code_predictor, drafter, frames: Frames | torch.Tensor, *, decoders: Sequence | None = None,
                        sampling: Sampling | None = None, seed: int = 0, max_rank: int = DEFAULT_MAX_RANK,
                        teacher_codes: str = "decoded") -> dict:
    """Empirical statistics of every decoder (default the chains 2..8 and the default tree) and the exact tables, as
    one JSON-able dict (NaN as ``None``). ``frames``: :class:`~rvqspec_lib.data.frames.Frames` or a ``(N, 2,
    talker_hidden)`` context tensor; ``teacher_codes``: the exact tables teacher-force the codes the first decoder
    committed (``"decoded"``, samples of p) or the frames' own (``"frames"``); every decoder restarts from ``seed``.

    Returns:
        ``{"drafter", "params_added", "sampling", "n_frames", "n_codes", "tokens_per_call" {label: value},
        "predicted_tokens_per_call" {label: value}, "per_depth_acceptance", "decoders" {label: decoder_statistics
        without codes}, "exact"}``, labels the decoders' names in the grammar.
    Raises:
        ValueError: no decoder, the same decoder twice, a bad ``teacher_codes``.
    """
    if teacher_codes not in ("decoded", "frames"):
        raise ValueError(f"teacher_codes must be 'decoded' or 'frames', got {teacher_codes!r}")
    sampling = Sampling() if sampling is None else sampling
    decoders = [Chain(w) for w in CHAIN_WINDOWS] + [Tree(DEFAULT_TREE)] if decoders is None else list(decoders)
    if not decoders:
        raise ValueError("no decoder to evaluate")
    context = frames.context if isinstance(frames, Frames) else frames
    if teacher_codes == "frames" and not isinstance(frames, Frames):
        raise ValueError("teacher_codes='frames' needs Frames (with codes)")
    cp = code_predictor
    n = P.n_codes(cp)
    runs, first_codes = {}, None
    for dec in decoders:
        st = decoder_statistics(cp, drafter, context, dec, sampling=sampling, seed=seed)
        if first_codes is None:
            first_codes = st["codes"]
        if st["decoder"] in runs:
            raise ValueError(f"{st['decoder']} is evaluated twice: give each decoder once")
        runs[st["decoder"]] = st
    k_eval = max(max(d.tree(n).max_depth for d in decoders), 1)
    ranks = max(max_rank, max((d.tree(n).max_rank + 1 for d in decoders), default=0))
    codes = first_codes if teacher_codes == "decoded" else frames.codes
    exact = exact_statistics(cp, drafter, context, codes, n_ahead=k_eval, sampling=sampling, max_rank=ranks)
    predicted = {label: predicted_tokens_per_call(exact, dec, n) for label, dec in zip(runs, decoders)}
    describe = drafter.describe() if hasattr(drafter, "describe") else {"name": getattr(drafter, "name", "?")}
    return {
        "drafter": describe,
        "params_added": int(getattr(drafter, "params_added", 0)),
        "sampling": sampling.describe(),
        "n_frames": int(context.shape[0]),
        "n_codes": n,
        "seed": seed,
        "tokens_per_call": {k: v["tokens_per_call"] for k, v in runs.items()},
        "predicted_tokens_per_call": predicted,
        "per_depth_acceptance": _json(exact["alpha_by_depth"]),
        "decoders": {k: {kk: (_json(vv) if isinstance(vv, np.ndarray) else vv) for kk, vv in v.items()
                         if kk not in ("codes", "calls")}
                     for k, v in runs.items()},
        "exact": {"teacher_codes": teacher_codes,
                  **{k: (_json(v) if isinstance(v, np.ndarray) else v) for k, v in exact.items()}},
    }
