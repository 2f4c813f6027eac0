"""The inner loop: one frame's codes 1..n_codes, :func:`decode_frame` = the 2-position prefill (code 1), then rounds
of draft -> verify -> accept -> commit (docs/style.md#the-decode-round); AR is the round with an empty tree. Tokens
per call count the prefill, as the paper's toks/step. Nodes past the last depth are masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding import verify as verify_rules
from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.decoding.sampling import Sampling, or_fresh_generator, sample
from rvqspec_lib.decoding.trees import DraftTree


def sample_drafts(q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Chain drafts: ``(N, V)`` warped q -> ``(N,)`` int64. Module-level so that a negative control can replace it."""
    return sample(q, generator)


def sample_tree_drafts(q: torch.Tensor, plan: "RoundPlan", node_codes: torch.Tensor,
                       generator: torch.Generator) -> "Draft":
    """Children SAMPLED from q ``(B, K, V)`` without replacement by Gumbel-top-k (Kool et al. 2019;
    docs/methods.md#sampled-children-without-replacement): child i gets q less its earlier siblings' codes,
    renormalised; a child with no code left (e.g. greedy) does not exist, nor its subtree. ``node_codes`` ``(B, M+1)``
    (root filled in) is written in place; one ``torch.rand`` for all sibling groups, in group order. Returns a
    :class:`Draft` with ``q`` ``(B, M+1, V)`` and ``exists`` ``(B, M+1)``."""
    b, _, v = q.shape
    dev = q.device
    sizes = [b * n for n in plan.sample_parents_per_group]
    u = torch.rand(sum(sizes) * v, generator=generator, device=dev, dtype=torch.float32)
    if b > 1:  # back to one (B, P_g, V) block per group, then side by side: (B, R, V)
        u = torch.cat([c.view(b, -1, v) for c in u.split([n * v for n in sizes])], 1)
    u = u.view(b, -1, v)
    keys = torch.log(q)[:, plan.sample_row_offset] - torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))  # -inf: q=0
    top = torch.topk(keys, plan.sample_max_children, dim=-1)  # (B, R, k) in key order = sequential draws' order
    node_codes[:, 1:] = top.indices[:, plan.sample_node_row, plan.sample_node_sibling]
    finite = torch.isfinite(top.values[:, plan.sample_node_row, plan.sample_node_sibling])  # (B, M)
    finite = torch.cat([torch.ones_like(finite[:, :1]), finite], 1)
    exists = (finite[:, None, :] | ~plan.ancestors).all(-1)  # a node and all its ancestors drawn
    # q_i: q with the codes of the earlier siblings removed (sent to a spare column V when there are none)
    sib = top.indices[:, plan.sample_node_row]  # (B, M, k)
    removed = torch.zeros(b, plan.tree.n_nodes, v + 1, dtype=torch.bool, device=dev)
    removed.scatter_(2, torch.where(plan.sample_earlier, sib, v), True)
    qi = q[:, plan.draft_offset].masked_fill(removed[..., :v], 0.0)
    q_nodes = torch.cat([torch.zeros_like(q[:, :1]), qi / qi.sum(-1, keepdim=True).clamp_min(1e-30)], 1)
    return Draft(node_codes, q_nodes, exists)


@dataclass
class FrameResult:
    """Codes of one frame and what it cost (int64 tensors).

    Attributes:
        codes: ``(B, n_codes)`` codes 1..n_codes (15). calls: ``(B,)`` code-predictor calls, the prefill included.
        committed, accepted, start_depth: ``(B, n_calls)`` codes committed (0 once done), drafts accepted, depth
            before each call; ``None`` from a whole-frame runner.
        replay: what a TIMING REPLAY (docs/precision.md#timing-replay) replayed; ``codes`` is then all -1.
    """

    codes: torch.Tensor
    calls: torch.Tensor
    committed: torch.Tensor | None = None
    accepted: torch.Tensor | None = None
    start_depth: torch.Tensor | None = None
    replay: str | None = None

    @property
    def tokens_per_call(self) -> torch.Tensor:
        """``(B,)`` float: codes per code-predictor call (n_codes / calls)."""
        return self.codes.shape[1] / self.calls.to(torch.float64)


def _check_context(code_predictor, context: torch.Tensor) -> None:
    if not (hasattr(code_predictor, "lm_head") and hasattr(code_predictor, "small_to_mtp_projection")):
        hint = " (pass lm.code_predictor)" if hasattr(code_predictor, "code_predictor") or hasattr(
            code_predictor, "talker") else ""
        raise ValueError(f"code_predictor must be the official code predictor module, model.talker.code_predictor; "
                         f"got {type(code_predictor).__name__}{hint}")
    if P.n_codes(code_predictor) < 1:
        raise ValueError(f"this code predictor has num_code_groups {P.n_codes(code_predictor) + 1}: with one code "
                         "group per frame the talker emits every code and the inner loop has nothing to decode (it "
                         "needs num_code_groups >= 2)")
    h = P.talker_hidden_size(code_predictor)
    if not isinstance(context, torch.Tensor) or context.dim() != 3 or context.shape[1] != 2 or context.shape[2] != h:
        shape = tuple(context.shape) if isinstance(context, torch.Tensor) else type(context).__name__
        raise ValueError(f"context must be a float tensor of shape (B, 2, {h}) = [talker hidden state that emitted "
                         f"code 0, talker embedding of code 0]; got {shape}")
    if context.shape[0] < 1 or not context.is_floating_point():
        raise ValueError("context must be a non-empty floating-point tensor")
    if not bool(torch.isfinite(context).all()):
        raise ValueError("context holds NaN or inf: check the talker's hidden states (a diverged or half-loaded "
                         "checkpoint, or float16 overflow: load in float32)")


# ---- The round, step by step -----------------------------------------------------------------------------------------
@dataclass
class RoundPlan:
    """One tree's constants on the decode device, built once (:func:`plan_for` caches them per decoder).

    Attributes:
        tree: the compiled :class:`~rvqspec_lib.decoding.trees.DraftTree` (node 0 = root = the last committed code);
            ``depth``, ``ancestors``, ``children``, ``rank[1:]`` its buffers on the device.
        eye: ``(1, M+1, M+1)`` bool: every query sees itself (never an empty attention row).
        sampled: drafts SAMPLED from q (Chain, sampled Tree), not the top-ranked codes. slots: ``n_codes + M + 1``.
        chain_shaped: at most one child a node: the Chain sampler (draw for draw the same), no cache compaction.
        sibling_groups: ``(offset, parents (P,), children (P, k))``: parents whose k children are drawn together.
        draft_offset: ``(M,)`` the drafter's output row of each non-root node (no gather if nodes_in_offset_order).
        sample_*: the sibling groups flattened for :func:`sample_tree_drafts` (parent rows R in group order; each
            node's parent row and sibling index; ``sample_earlier`` ``(M, k)``: sibling j < i).
        tolerance: 0.0, or the LOSSY control's beta (:func:`~rvqspec_lib.decoding.verify.walk_tree`).
    """

    tree: DraftTree
    depth: torch.Tensor
    ancestors: torch.Tensor
    children: torch.Tensor
    rank: torch.Tensor
    eye: torch.Tensor
    sampled: bool
    slots: int
    chain_shaped: bool = True
    sibling_groups: tuple = ()
    slot_index: torch.Tensor | None = None
    node_index: torch.Tensor | None = None
    draft_offset: torch.Tensor | None = None
    nodes_in_offset_order: bool = False
    sample_parents_per_group: tuple = ()
    sample_row_offset: torch.Tensor | None = None
    sample_max_children: int = 0
    sample_node_row: torch.Tensor | None = None
    sample_node_sibling: torch.Tensor | None = None
    sample_earlier: torch.Tensor | None = None
    tolerance: float = 0.0

    @property
    def n_query(self) -> int:
        """Query positions of a verify call: the root plus the nodes (N)."""
        return self.tree.n_nodes + 1

    @classmethod
    def build(cls, tree: DraftTree, n_codes: int, *, sampled: bool, device, tolerance: float = 0.0) -> "RoundPlan":
        """The plan of ``tree`` for frames of ``n_codes`` codes on ``device`` (arguments: the attributes)."""
        m1 = tree.n_nodes + 1
        kids = [[int(c) for c in row if c >= 0] for row in tree.children]
        groups: dict[tuple[int, int], list[int]] = {}
        for v, ch in enumerate(kids):
            if ch:
                groups.setdefault((int(tree.depth[v]) + 1, len(ch)), []).append(v)
        sibling_groups = tuple(
            (t, torch.tensor(parents, device=device), torch.tensor([kids[v] for v in parents], device=device))
            for (t, _), parents in sorted(groups.items()))
        depth = tree.depth.to(device)
        # sibling groups flattened: parent rows in group order, and each node's (parent row, sibling index)
        row_offset, node_row, node_sib = [], [0] * (m1 - 1), [0] * (m1 - 1)
        for (t, _), parents in sorted(groups.items()):
            for v in parents:
                for i, c in enumerate(kids[v]):
                    node_row[c - 1], node_sib[c - 1] = len(row_offset), i
                row_offset.append(t - 1)
        k_max = max((len(ch) for ch in kids), default=0)
        lt = torch.arange(max(k_max, 1), device=device)[None, :] < torch.tensor(node_sib, device=device)[:, None]
        return cls(tree, depth, tree.ancestors.to(device), tree.children.to(device),
                   tree.rank[1:].to(device), torch.eye(m1, dtype=torch.bool, device=device)[None], sampled,
                   n_codes + m1, all(len(ch) <= 1 for ch in kids), sibling_groups,
                   torch.arange(n_codes + m1, device=device), torch.arange(m1, device=device), depth[1:] - 1,
                   tree.depth[1:].tolist() == list(range(1, m1)),
                   tuple(len(parents) for _, parents in sorted(groups.items())),
                   torch.tensor(row_offset, dtype=torch.long, device=device), k_max,
                   torch.tensor(node_row, dtype=torch.long, device=device),
                   torch.tensor(node_sib, dtype=torch.long, device=device), lt, float(tolerance))


_PLANS: dict = {}
#: Plans kept by :func:`plan_for` (one per decoder, codes per frame and device met; a handful in practice).
MAX_CACHED_PLANS = 256


def plan_for(decoder, n_codes: int, device) -> RoundPlan:
    """The :class:`RoundPlan` of ``decoder`` for ``n_codes`` codes on ``device``, cached (equal frozen decoders share
    one; an unhashable decoder gets a fresh plan)."""
    try:
        key = (decoder, int(n_codes), str(torch.device(device)))
        hash(key)
    except TypeError:
        key = None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = RoundPlan.build(decoder.tree(n_codes), n_codes, sampled=decoder.sampled_drafts, device=device,
                               tolerance=getattr(decoder, "lossy_tolerance", 0.0))
        if key is not None and len(_PLANS) < MAX_CACHED_PLANS:
            _PLANS[key] = plan
    return plan


@dataclass
class FrameState:
    """Where a batch of frames stands between rounds: ``codes`` ``(B, n_codes)`` so far, ``s`` ``(B,)`` depth of the
    last committed code (``n_codes``: done), ``h`` ``(B, H)`` its hidden state, ``n_slots`` ``(B,)`` committed KV
    slots (at the front of ``cache``), ``calls`` and the per-call logs of :class:`FrameResult`, the frame's
    :class:`~rvqspec_lib.decoding.predictor.VerifyBackend`, ``rows`` ``arange(B)``."""

    codes: torch.Tensor
    s: torch.Tensor
    h: torch.Tensor
    n_slots: torch.Tensor
    cache: object
    calls: torch.Tensor
    log_committed: list = field(default_factory=list)
    log_accepted: list = field(default_factory=list)
    log_start: list = field(default_factory=list)
    backend: P.VerifyBackend | None = None
    rows: torch.Tensor | None = None

    @property
    def n_codes(self) -> int:
        """Codes a frame."""
        return int(self.codes.shape[1])

    @property
    def active(self) -> torch.Tensor:
        """``(B,)`` bool: rows with codes left."""
        return self.s < self.n_codes

    def result(self) -> FrameResult:
        """The finished frame, per-call logs stacked to ``(B, n_calls)``."""
        return FrameResult(self.codes, self.calls, torch.stack(self.log_committed, 1),
                           torch.stack(self.log_accepted, 1), torch.stack(self.log_start, 1))


@dataclass
class Draft:
    """A round's draft: ``node_codes`` ``(B, M+1)`` int64 (entry 0 = the root), ``q`` ``(B, M+1, V)`` float32 the
    distribution each node's code was SAMPLED from (``None``: point-mass drafts), ``exists`` ``(B, M+1)`` bool
    (``None`` = all; see :func:`sample_tree_drafts`)."""

    node_codes: torch.Tensor
    q: torch.Tensor | None
    exists: torch.Tensor | None = None


@dataclass
class Verified:
    """A verify call's outcome: ``hidden`` ``(B, M+1, H)``, ``p`` ``(B, M+1, V)`` float32 target distribution after
    each node, ``node_valid`` ``(B, M+1)`` bool (the node exists: drafts never run past the last depth), ``fed``
    ``(B, M+1)`` bool (a code remains after the node), ``write_slots`` ``(B, M+1)`` the cache slots it wrote."""

    hidden: torch.Tensor
    p: torch.Tensor
    node_valid: torch.Tensor
    fed: torch.Tensor
    write_slots: torch.Tensor


@runtime_checkable
class AcceptanceHook(Protocol):
    """The accept step of a TIMING REPLAY, in place of :func:`accept` (docs/precision.md#timing-replay; the oracle:
    ``rvqspec_lib.eval.replay.AcceptanceOracle``)."""

    def walk(self, plan: RoundPlan, state: FrameState, drafted: Draft, verified: Verified) -> verify_rules.WalkResult:
        """The round's outcome, as :func:`rvqspec_lib.decoding.verify.walk_tree` returns it."""

    def seal(self, result: FrameResult) -> FrameResult:
        """The frame's result made unusable as audio: ``codes`` all -1 and ``replay`` naming what was replayed."""


def prefill(code_predictor, context: torch.Tensor, plan: RoundPlan, sampling: Sampling,
            generator: torch.Generator, backend: P.VerifyBackend | None = None) -> FrameState:
    """The frame's first call: positions 0, 1 = the projected context ``(B, 2, talker_hidden)`` -> code 1. Returns
    the :class:`FrameState`; ``backend``: every call's (``None``: the official module)."""
    cp = code_predictor
    backend = P.OfficialBackend(cp) if backend is None else backend
    n, dev = P.n_codes(cp), context.device
    b = context.shape[0]
    cache = backend.new_cache(b, plan.slots)
    x = cp.small_to_mtp_projection(context.to(P.param_dtype(cp)))
    two = plan.slot_index[:2]
    allow = (plan.slot_index[None, :] <= two[:, None]).expand(b, 2, plan.slots)  # causal over slots 0, 1
    hid = backend.forward(x, two.expand(b, 2), allow, cache, two.expand(b, 2))
    h = hid[:, 1]
    codes = torch.zeros(b, n, dtype=torch.long, device=dev)
    zero = torch.zeros(b, dtype=torch.long, device=dev)
    codes[:, 0] = sample(sampling.probs(backend.logits(h, zero)), generator)
    one = zero + 1
    return FrameState(codes, one, h, one + 1, cache, one, [one], [zero], [zero], backend,
                      torch.arange(b, device=dev))


def draft(code_predictor, drafter, plan: RoundPlan, state: FrameState, sampling: Sampling,
          generator: torch.Generator) -> Draft:
    """Step 1, draft: q for depths s+1..s+K from H_s, then the nodes' codes (sampled, in offset order and before any
    acceptance draw; or top-ranked). Returns the :class:`Draft`."""
    cp, b, k_max = code_predictor, state.codes.shape[0], plan.tree.max_depth
    root = state.codes.gather(1, (state.s - 1).clamp(max=state.n_codes - 1)[:, None])  # (B, 1) the last code
    if k_max == 0:
        return Draft(root, None)
    d_logits = drafter.draft_logits(cp, state.h, state.s, k_max, logits=state.backend.logits)  # (B, K, V)
    if plan.sampled and not plan.chain_shaped:
        node_codes = torch.zeros(b, plan.n_query, dtype=torch.long, device=root.device)
        node_codes[:, :1] = root
        return sample_tree_drafts(sampling.probs(d_logits), plan, node_codes, generator)
    if plan.sampled:
        q = sampling.probs(d_logits)  # the same warpers as p
        drafts = sample_drafts(q.reshape(b * k_max, -1), generator).reshape(b, k_max)
        if not plan.nodes_in_offset_order:
            drafts, q = drafts[:, plan.draft_offset], q[:, plan.draft_offset]
        return Draft(torch.cat([root, drafts], 1), torch.cat([torch.zeros_like(q[:, :1]), q], 1))
    top = torch.topk(d_logits, plan.tree.max_rank + 1, dim=-1).indices  # (B, K, R)
    return Draft(torch.cat([root, top[:, plan.draft_offset, plan.rank]], 1), None)


def verify(code_predictor, plan: RoundPlan, state: FrameState, drafted: Draft, sampling: Sampling) -> Verified:
    """Step 2, verify: ONE call over the root and the drafted nodes, each attending to the committed slots and its
    ancestors, then p after every node that has a code after it."""
    n, backend = state.n_codes, state.backend
    b, m1 = state.codes.shape[0], plan.n_query
    abs_depth = state.s[:, None] + plan.depth  # (B, M+1) depth of each node's code
    node_valid = state.active[:, None] & (abs_depth <= n)
    if drafted.exists is not None:
        node_valid &= drafted.exists
    fed = node_valid & (abs_depth < n)
    embeds = backend.embed(drafted.node_codes, abs_depth)  # (B, M+1, H)
    # new positions go right after the committed slots (a finished row rewrites its own tail: its output is unused)
    write = state.n_slots.clamp(max=plan.slots - m1)[:, None] + plan.node_index  # (B, M+1)
    allow = (plan.slot_index < state.n_slots[:, None, None]).expand(b, m1, plan.slots).clone()  # (B, M+1, S)
    self_mask = (plan.ancestors & fed[:, None, :]) | plan.eye  # (B, M+1, M+1)
    allow.scatter_(2, write[:, None, :].expand(b, m1, m1), self_mask)
    hid = backend.forward(embeds, abs_depth + 1, allow, state.cache, write)  # (B, M+1, H)
    n_fed = int(fed.sum())
    if n_fed == b * m1:  # every node has a code after it (mid-frame): no masked copies
        p = sampling.probs(backend.logits(hid.reshape(b * m1, -1), abs_depth.reshape(-1))).reshape(b, m1, -1)
    else:
        p = torch.zeros(b, m1, int(code_predictor.config.vocab_size), dtype=torch.float32, device=hid.device)
        if n_fed:
            p[fed] = sampling.probs(backend.logits(hid[fed], abs_depth[fed]))
    return Verified(hid, p, node_valid, fed, write)


def accept(plan: RoundPlan, drafted: Draft, verified: Verified, generator: torch.Generator) -> verify_rules.WalkResult:
    """Step 3, accept: the lossless walk, :func:`rvqspec_lib.decoding.verify.walk_tree`."""
    return verify_rules.walk_tree(verified.p, drafted.node_codes, plan.children, verified.node_valid, verified.fed,
                                  generator, drafted.q, tolerance=plan.tolerance)


def commit(plan: RoundPlan, state: FrameState, drafted: Draft, verified: Verified,
           walk: verify_rules.WalkResult) -> None:
    """Step 4, commit: write the accepted drafts and the next code, keep the accepted nodes' KV slots (moved to the
    front), take the last accepted node's hidden state for the next round."""
    n, active, s = state.n_codes, state.active, state.s
    b, m1 = s.shape[0], plan.n_query
    keep = torch.zeros(b, m1, dtype=torch.bool, device=s.device)  # nodes whose KV stays: fed root + accepted path
    keep[:, 0] = verified.fed[:, 0]
    if walk.path.shape[1]:
        r, k = (walk.path >= 0).nonzero(as_tuple=True)  # accepted drafts: row, offset - 1
        node = walk.path[r, k]
        state.codes[r, s[r] + k] = drafted.node_codes[r, node]
        keep[r, node] = verified.fed[r, node]
    has_next = walk.next_code >= 0
    write_next = (has_next & active)[:, None]
    col = (s + walk.n_accepted).clamp(max=n - 1)[:, None]
    state.codes.scatter_(1, col, torch.where(write_next, walk.next_code[:, None], state.codes.gather(1, col)))
    keep &= active[:, None]
    if not plan.chain_shaped:  # a tree's accepted path may skip slots: move the kept ones to the front
        kept = plan.slot_index < state.n_slots[:, None]  # (B, S)
        kept.scatter_(1, verified.write_slots, keep | (kept.gather(1, verified.write_slots) & ~active[:, None]))
        state.backend.compact(state.cache, torch.sort((~kept).to(torch.int8), dim=1, stable=True).indices)
    state.n_slots = state.n_slots + keep.sum(1)
    state.h = torch.where(active[:, None], verified.hidden[state.rows, walk.last_node], state.h)
    zero = torch.zeros_like(s)
    committed = torch.where(active, walk.n_accepted + has_next.long(), zero)
    state.log_committed.append(committed)
    state.log_accepted.append(torch.where(active, walk.n_accepted, zero))
    state.log_start.append(torch.where(active, s, zero))
    state.s = s + committed
    state.calls = state.calls + active.long()


@torch.inference_mode()
def decode_frame(
    code_predictor,
    context: torch.Tensor,
    *,
    decoder=None,
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
    drafter=None,
    backend: P.VerifyBackend | None = None,
    acceptance: AcceptanceHook | None = None,
) -> FrameResult:
    """Decode codes 1..n_codes of one frame: :func:`prefill`, then :func:`draft` -> :func:`verify` -> :func:`accept`
    -> :func:`commit` rounds until every row is done.

    Args:
        code_predictor: the official module (``model.talker.code_predictor``), any config and dtype.
        context: ``(B, 2, talker_hidden)`` float = [talker hidden state that emitted code 0 (after the final norm),
            talker embedding of code 0].
        decoder: :class:`~rvqspec_lib.decoding.decoders.AR` (default), ``Chain`` or ``Tree``.
        sampling: default the checkpoints'. generator: ``None``: a fresh unseeded one, never the global RNG.
        drafter: default the reused heads; a decoder carrying its own drafter uses that one.
        backend: a :class:`~rvqspec_lib.decoding.predictor.VerifyBackend` (default the official module); the random
            draws are the same whatever the backend.
        acceptance: TIMING REPLAY only (:class:`AcceptanceHook`): the result is sealed (codes all -1).

    Returns:
        :class:`FrameResult`; rows of a batch may accept different lengths.
    Raises:
        ValueError: a context of the wrong shape, an invalid decoder, a code predictor with one code group (nothing
            to decode), a tree rank outside the codebook.
    """
    decoder = AR() if decoder is None else decoder
    if not hasattr(decoder, "tree"):
        raise ValueError(f"decoder must be AR(), Chain(window=N) or Tree(paths=...), got {decoder!r}")
    sampling = Sampling() if sampling is None else sampling
    own = getattr(decoder, "drafter", None)
    drafter = own if own is not None else ReusedHeads() if drafter is None else drafter
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)) or None, got "
                         f"{type(generator).__name__}")
    _check_context(code_predictor, context)
    generator = or_fresh_generator(generator, context.device)
    cp = code_predictor
    n = P.n_codes(cp)
    tree = decoder.tree(n)
    vocab = int(cp.config.vocab_size)
    if tree.max_rank >= vocab:
        raise ValueError(f"tree rank {tree.max_rank} is out of range for a codebook of {vocab} codes: "
                         f"use ranks 0..{vocab - 1}")
    plan = plan_for(decoder, n, context.device)
    state = prefill(cp, context, plan, sampling, generator, backend)
    while bool(state.active.any()):
        drafted = draft(cp, drafter, plan, state, sampling, generator)
        verified = verify(cp, plan, state, drafted, sampling)
        walk = accept(plan, drafted, verified, generator) if acceptance is None else \
            acceptance.walk(plan, state, drafted, verified)
        commit(plan, state, drafted, verified, walk)
    return state.result() if acceptance is None else acceptance.seal(state.result())
