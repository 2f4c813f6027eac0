"""The lossless accept/reject rules, pure functions of p (target), q (draft) and an explicit generator: one walk for
sampled and point-mass children (docs/methods.md#one-walk-for-every-rule; why it preserves p:
docs/methods.md#why-the-rules-preserve-p). Tested in tests/test_lossless.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rvqspec_lib.decoding.sampling import or_fresh_generator


@dataclass
class WalkResult:
    """Outcome of verifying one tree per row (int64): ``path`` ``(B, D)`` accepted nodes in order (root excluded,
    -1 padded), ``n_accepted`` ``(B,)``, ``last_node`` ``(B,)`` the deepest accepted node (0 = root), ``next_code``
    ``(B,)`` the residual or bonus code sampled after the path (-1: the frame's last depth was reached)."""

    path: torch.Tensor
    n_accepted: torch.Tensor
    last_node: torch.Tensor
    next_code: torch.Tensor


def acceptance_ratio(p_resid: torch.Tensor, x: torch.Tensor, q_x: torch.Tensor | None) -> torch.Tensor:
    """``(B,)`` ``min(1, p(x)/q(x))``, p the normalised residual ``p_resid`` ``(B, V)``, x ``(B,)`` int64 drafts,
    ``q_x`` ``(B,)`` their draft probability (``None``: point mass, q(x) = 1)."""
    total = p_resid.sum(-1).clamp_min(1e-30)
    p_x = p_resid.gather(1, x[:, None]).squeeze(1) / total
    if q_x is None:
        return p_x
    return torch.clamp(p_x / q_x.clamp_min(1e-30), max=1.0)


def residual(p_resid: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """``(B, V)`` unnormalised target mass left after rejecting x ``(B,)``: ``max(norm(p) - q, 0)``, or p with x
    zeroed for a point mass (``q`` ``None``). A row left with no mass (rounding when p == q) falls back to p, the
    exact answer then. No host check (the fused chain's compiled round uses it)."""
    if q is None:
        out = p_resid.scatter(1, x[:, None], 0.0)
    else:
        out = torch.clamp(p_resid / p_resid.sum(-1, keepdim=True).clamp_min(1e-30) - q, min=0.0)
    return torch.where(out.sum(-1, keepdim=True) > 0, out, p_resid)


def walk_tree(
    p: torch.Tensor,
    node_codes: torch.Tensor,
    children: torch.Tensor,
    node_valid: torch.Tensor,
    has_next: torch.Tensor,
    generator: torch.Generator | None,
    q: torch.Tensor | None = None,
    tolerance: float = 0.0,
) -> WalkResult:
    """Verify a draft tree per row (the lossless multi-child rule), vectorised over rows.

    Args:
        p: ``(B, M+1, V)`` float target distribution after each node (0 = root; unreached rows may hold anything).
        node_codes: ``(B, M+1)`` int64 drafted codes (root ignored). children: ``(M+1, C)`` int64, -1 padded, in
            the order tried. node_valid, has_next: ``(B, M+1)`` bool, the node exists; a code remains after it.
        generator: ``None``: a fresh unseeded one (never the global RNG).
        q: ``(B, M+1, V)`` the distribution each code was SAMPLED from, ``None`` for point-mass drafts.
        tolerance: ``0.0`` (lossless); beta > 0 is SSD's LOSSY rule ``u < min(1, p/q) + beta``
            (docs/methods.md#ssd-tolerance-rule-a-lossy-control), ignored by point-mass drafts.
    """
    generator = or_fresh_generator(generator, p.device)
    walk = walk_tree_one_row if p.shape[0] == 1 else walk_tree_batched
    return walk(p, node_codes, children, node_valid, has_next, generator, q, tolerance)


def walk_tree_batched(p, node_codes, children, node_valid, has_next, generator, q=None,
                      tolerance: float = 0.0) -> WalkResult:
    """:func:`walk_tree` vectorised: a step draws ``torch.rand(B)`` whenever any row tries a child there."""
    b, m1, v = p.shape
    dev = p.device
    rows = torch.arange(b, device=dev)
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    resid = p[:, 0].clone()
    path = []
    n_children = children.shape[1]
    max_levels = m1  # a path cannot be longer than the number of nodes
    for _ in range(max_levels):
        if not bool((alive & (children[cur, 0] >= 0)).any()):
            break
        moved = torch.zeros(b, dtype=torch.bool, device=dev)
        for i in range(n_children):
            c = children[cur, i]
            cc = c.clamp_min(0)
            ok = alive & ~moved & (c >= 0) & node_valid[rows, cc]
            if not bool(ok.any()):
                continue
            x = node_codes[rows, cc]
            q_c = q[rows, cc] if q is not None else None
            ratio = acceptance_ratio(resid, x, None if q_c is None else q_c.gather(1, x[:, None]).squeeze(1))
            if tolerance and q_c is not None:  # LOSSY (SSD): departs from the rule on purpose, a control only
                ratio = ratio + tolerance
            u = torch.rand(b, generator=generator, device=dev)
            acc = ok & (u < ratio)
            rej = ok & ~acc
            if bool(rej.any()):
                resid = torch.where(rej[:, None], residual(resid, x, q_c), resid)
            if bool(acc.any()):
                cur = torch.where(acc, c, cur)
                resid = torch.where(acc[:, None], p[rows, cc], resid)
                moved |= acc
        alive &= moved
        if not bool(moved.any()):
            break
        path.append(torch.where(moved, cur, torch.full_like(cur, -1)))
    # the code after the accepted path: residual (after rejections) or bonus (leaf / all accepted)
    nxt = has_next[rows, cur]
    safe = torch.where(nxt[:, None], resid, torch.ones_like(resid))
    code = torch.multinomial(safe, 1, generator=generator).squeeze(1)
    code = torch.where(nxt, code, torch.full_like(code, -1))
    path_t = torch.stack(path, 1) if path else torch.full((b, 0), -1, dtype=torch.long, device=dev)
    return WalkResult(path_t, (path_t >= 0).sum(1), cur, code)


def walk_tree_one_row(p, node_codes, children, node_valid, has_next, generator, q=None,
                      tolerance: float = 0.0) -> WalkResult:
    """:func:`walk_tree` for ONE row (the latency case) in Python control flow: bit for bit
    :func:`walk_tree_batched`'s result, the same draws in the same order (tests/test_lossless.py)."""
    kids = children.tolist()
    valid = node_valid[0].tolist()
    # a first child is tried against its parent's own p: those ratios are computed for every node at once (a row's
    # result does not depend on the other rows); later children's when they are reached
    first = {row[0]: v for v, row in enumerate(kids) if row[0] >= 0}
    if first:
        c_all = torch.tensor(list(first), device=p.device)
        x_all = node_codes[0, c_all]
        q_all = None if q is None else q[0, c_all].gather(1, x_all[:, None]).squeeze(1)
        first = dict(zip(first, acceptance_ratio(p[0, list(first.values())], x_all, q_all).tolist()))
    resid = p[:, 0].clone()  # (1, V)
    cur, path = 0, []
    for _ in range(p.shape[1]):  # a path cannot be longer than the number of nodes
        moved = False
        for i, c in enumerate(kids[cur]):
            if c < 0:
                break  # children are -1 padded
            if not valid[c]:
                continue
            x = node_codes[:, c]  # (1,)
            q_c = q[:, c] if q is not None else None
            if i == 0:  # float32 values compared exactly as Python floats
                ratio = first[c]
            else:
                ratio = float(acceptance_ratio(resid, x, None if q_c is None else
                                               q_c.gather(1, x[:, None]).squeeze(1)))
            if tolerance and q_c is not None:  # LOSSY (SSD): departs from the rule on purpose, a control only
                ratio = float(torch.tensor(ratio, dtype=p.dtype) + tolerance)
            if float(torch.rand(1, generator=generator, device=p.device)) < ratio:
                cur, resid, moved = c, p[:, c], True
                break
            resid = residual(resid, x, q_c)
        if not moved:
            break
        path.append(cur)
    dev = p.device
    nxt = bool(has_next[0, cur])
    # the code after the accepted path: residual (after rejections) or bonus (leaf / all accepted)
    code = torch.multinomial(resid if nxt else torch.ones_like(resid), 1, generator=generator).squeeze(1)
    if not nxt:
        code = torch.full_like(code, -1)
    path_t = torch.tensor([path], dtype=torch.long, device=dev) if path else \
        torch.full((1, 0), -1, dtype=torch.long, device=dev)
    return WalkResult(path_t, torch.tensor([len(path)], device=dev), torch.tensor([cur], device=dev), code)
