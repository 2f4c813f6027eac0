"""The lossless rule by hand (notebook 02; docs/methods.md#accept-and-reject-rules): one speculative round on a
hand-made toy target (:class:`ToyTarget`, no model) through the library's own draft and
:func:`rvqspec_lib.decoding.verify.walk_tree` (:func:`toy_round`, :func:`trace_round`), beside its exact law
(:func:`exact_round_law`), compared by :func:`g_test`."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from scipy import stats

from rvqspec_lib.decoding import verify
from rvqspec_lib.decoding.decode import sample_drafts
from rvqspec_lib.decoding.trees import DraftTree

#: Rows of a probability table must sum to 1 within this (the tables are typed by hand).
SUM_TOLERANCE = 1e-6
#: Bins of expected count below this are pooled before a G-test (the usual validity rule of the chi-square
#: approximation; tests/test_lossless.py pools the same way).
MIN_EXPECTED = 5.0


def _pmf_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    t = torch.as_tensor(t, dtype=torch.float64)
    if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
        raise ValueError(f"{name} must hold finite non-negative probabilities")
    if bool(((t.sum(-1) - 1).abs() > SUM_TOLERANCE).any()):
        raise ValueError(f"every row of {name} must sum to 1, got sums {t.sum(-1).tolist()}")
    return t / t.sum(-1, keepdim=True)


@dataclass(frozen=True)
class ToyTarget:
    """The verifier of the toy: a first-order chain over the depths of a frame.

    Attributes:
        first: ``(V,)`` p of the code at the first depth after the root (the root is the last committed code).
        transition: ``(V, V)``; row c is p of the next code after a node whose code is c.

    Raises:
        ValueError: shapes that do not match, negative entries, rows that do not sum to 1.
    """

    first: torch.Tensor
    transition: torch.Tensor

    def __post_init__(self):
        first = _pmf_rows(self.first, "first")
        trans = _pmf_rows(self.transition, "transition")
        if first.dim() != 1 or trans.shape != (first.shape[0], first.shape[0]):
            raise ValueError(f"first must be (V,) and transition (V, V); got {tuple(first.shape)} and "
                             f"{tuple(trans.shape)}")
        object.__setattr__(self, "first", first)
        object.__setattr__(self, "transition", trans)

    @property
    def vocab(self) -> int:
        return int(self.first.shape[0])

    def node_p(self, node_codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """p after every node, what the verify call computes: ``(B, M+1)`` codes -> ``(B, M+1, V)`` (the root:
        :attr:`first`; a node of code c: ``transition[c]``)."""
        b, m1 = node_codes.shape
        p = torch.empty(b, m1, self.vocab, dtype=dtype)
        p[:, 0] = self.first.to(dtype)
        p[:, 1:] = self.transition[node_codes[:, 1:]].to(dtype)
        return p

    def path_probability(self, codes) -> float:
        """Target probability of the codes ``(c_1, .., c_t)`` at depths 1..t of the round, in order."""
        codes = [int(c) for c in codes]
        if not codes:
            return 1.0
        out = float(self.first[codes[0]])
        for a, b in zip(codes, codes[1:]):
            out *= float(self.transition[a, b])
        return out

    def path_probabilities(self, tree: DraftTree, node_codes: torch.Tensor) -> torch.Tensor:
        """``(M+1,)`` float64: the target probability of every node's path of codes ``node_codes`` ``(M+1,)`` (the
        root: 1); for a point-mass tree, the probability the node is kept (docs/methods.md#expected-tokens-per-call)."""
        codes = node_codes.reshape(-1)
        return torch.tensor([self.path_probability(codes[list(path_nodes(tree, v))].tolist())
                             for v in range(tree.n_nodes + 1)], dtype=torch.float64)

    def joint(self, n_codes: int) -> torch.Tensor:
        """Exact joint pmf of the next ``n_codes`` codes, ``(V,) * n_codes`` float64 (what AR sampling gives)."""
        if n_codes < 1:
            raise ValueError(f"n_codes must be >= 1, got {n_codes}")
        return self._extend(self.first, n_codes - 1)

    def continuation(self, last: int, n_codes: int) -> torch.Tensor:
        """Exact joint pmf of the ``n_codes`` codes that follow a code ``last``, ``(V,) * n_codes`` float64 (a
        0-dimensional 1 when ``n_codes`` is 0)."""
        if n_codes == 0:
            return torch.ones((), dtype=torch.float64)
        return self._extend(self.transition[int(last)], n_codes - 1)

    def _extend(self, pmf: torch.Tensor, steps: int) -> torch.Tensor:
        """``pmf`` over codes (.., c) times the target's conditionals of ``steps`` more codes, one new axis each."""
        for _ in range(steps):
            pmf = pmf[..., None] * self.transition.view(*([1] * (pmf.dim() - 1)), self.vocab, self.vocab)
        return pmf


def path_nodes(tree: DraftTree, v: int) -> tuple[int, ...]:
    """The non-root nodes on the path to node ``v``, in depth order (``v`` last; ``()`` for the root)."""
    return tuple(u for u in range(1, int(v) + 1) if bool(tree.ancestors[int(v), u]))


def single_draft_breakdown(p: torch.Tensor, q: torch.Tensor, *, tolerance: float = 0.0) -> dict:
    """The single-draft rule's exact pieces (docs/methods.md#single-draft-rule) per code x, for a draft x ~ q.

    Args:
        p: ``(V,)`` target. q: ``(V,)`` draft distribution. tolerance: 0, or SSD's LOSSY beta.

    Returns:
        float64 tensors ``accept_prob`` (V,), ``accepted`` (V,) (drafted and kept: ``min(p, q)`` when lossless),
        ``residual`` (V,), ``reject_prob`` (scalar), ``output`` (V,) the committed code's law (p when lossless),
        ``tv`` the total variation between p and q.
    """
    p = _pmf_rows(p, "p")
    q = _pmf_rows(q, "q")
    v = p.shape[0]
    codes = torch.arange(v)
    ratio = verify.acceptance_ratio(p.expand(v, v), codes, q)
    accept = torch.clamp(ratio + tolerance, max=1.0) if tolerance else ratio
    accepted = q * accept
    reject = 1.0 - accepted.sum()
    resid = verify.residual(p[None], codes[:1], q[None])[0]
    resid = resid / resid.sum()
    return {"accept_prob": accept, "accepted": accepted, "residual": resid, "reject_prob": reject,
            "output": accepted + reject * resid, "tv": 0.5 * (p - q).abs().sum()}


def residual_steps(p: torch.Tensor, drafts, q: torch.Tensor | None = None) -> torch.Tensor:
    """The targets one node's children (codes ``drafts``, in order) are tried against: ``(len(drafts) + 1, V)``
    float64, p then the normalised residual after each rejection (the last row: what the code is drawn from when
    all are rejected). ``q``: ``None`` for point-mass children, else the ``(V,)`` they were sampled from."""
    rows = [_pmf_rows(p, "p")[None]]
    q = None if q is None else _pmf_rows(q, "q")[None]
    for x in drafts:
        left = verify.residual(rows[-1], torch.tensor([int(x)]), q)
        rows.append(left / left.sum())
    return torch.cat(rows)


def _check_tree(tree: DraftTree, q: torch.Tensor, sampled: bool) -> None:
    if tree.n_nodes == 0:
        raise ValueError("the tree has no node to draft (AR): one code per call, nothing to verify")
    if q.dim() != 2 or q.shape[0] < tree.max_depth:
        raise ValueError(f"q must be (K, V) with K >= the tree's depth {tree.max_depth}, got {tuple(q.shape)}")
    if sampled and any(int((tree.depth == d).sum()) != 1 for d in range(1, tree.max_depth + 1)):
        raise ValueError("sampled drafts are supported here on a chain (one node per offset); point-mass drafts "
                         "on any tree")
    if not sampled and tree.max_rank >= q.shape[1]:
        raise ValueError(f"tree rank {tree.max_rank} is out of range for {q.shape[1]} codes")


def draft_node_codes(tree: DraftTree, q: torch.Tensor, drafts: torch.Tensor | None = None, *,
                     root_code: int = 0) -> torch.Tensor:
    """The drafted code of every node, ``(B, M+1)`` int64, as :func:`rvqspec_lib.decoding.decode.draft` places them:
    ``drafts`` ``(B, K)`` sampled from q ``(K, V)`` (a chain), or ``None``: the top-ranked codes (``B = 1``)."""
    q = torch.as_tensor(q)
    _check_tree(tree, q, drafts is not None)
    offset = tree.depth[1:] - 1  # (M,) the row of q each non-root node drafts from
    if drafts is None:
        top = torch.topk(q, tree.max_rank + 1, dim=-1).indices  # (K, R) codes by rank, as decode.draft takes them
        nodes = top[offset, tree.rank[1:]][None]
    else:
        nodes = drafts[:, offset]
    root = torch.full((nodes.shape[0], 1), int(root_code), dtype=torch.long)
    return torch.cat([root, nodes], 1)


def committed_codes(walk: verify.WalkResult, node_codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes a walk commits, as :func:`rvqspec_lib.decoding.decode.commit` writes them: ``(codes (B, D+1) int64
    padded with -1, n_committed (B,) int64)``, D the walk's longest path."""
    b, d = walk.path.shape
    rows = torch.arange(b)
    out = torch.full((b, d + 1), -1, dtype=torch.long)
    if d:
        on = walk.path >= 0
        out[:, :d] = torch.where(on, node_codes[rows[:, None], walk.path.clamp_min(0)], out[:, :d])
    has = walk.next_code >= 0
    out[rows[has], walk.n_accepted[has]] = walk.next_code[has]
    return out, walk.n_accepted + has.long()


def _ratio(resid: torch.Tensor, x: torch.Tensor, q_c: torch.Tensor | None, tolerance: float):
    """``(acceptance ratio of child code x against resid, uncapped; q_x or None)`` as walk_tree computes them (the
    LOSSY SSD tolerance added in resid's dtype when drafts are sampled)."""
    q_x = None if q_c is None else q_c.gather(1, x[:, None]).squeeze(1)
    ratio = float(verify.acceptance_ratio(resid, x, q_x))
    if tolerance and q_c is not None:
        ratio = float(torch.tensor(ratio, dtype=resid.dtype) + tolerance)
    return ratio, q_x


def _validity(tree: DraftTree, depths_left: int | None) -> tuple[int, torch.Tensor, torch.Tensor]:
    left = tree.max_depth + 1 if depths_left is None else int(depths_left)
    if left < 1:
        raise ValueError(f"depths_left must be >= 1, got {depths_left}")
    return left, tree.depth <= left, tree.depth < left


@dataclass
class ToyRound:
    """Rows of independent rounds: ``node_codes`` ``(B, M+1)``, ``p`` ``(B, M+1, V)`` (what verify gave),
    ``q`` ``(B, M+1, V)`` each node's draft distribution (``None``: point-mass drafts), ``walk`` (the
    :class:`~rvqspec_lib.decoding.verify.WalkResult`), ``committed`` ``(B, D+1)`` and ``n_committed`` ``(B,)``."""

    node_codes: torch.Tensor
    p: torch.Tensor
    q: torch.Tensor | None
    walk: verify.WalkResult
    committed: torch.Tensor
    n_committed: torch.Tensor


def _round_inputs(target: ToyTarget, q: torch.Tensor, tree: DraftTree, node_codes: torch.Tensor, sampled: bool,
                  depths_left: int | None, dtype=torch.float32):
    b = node_codes.shape[0]
    _, valid, has_next = _validity(tree, depths_left)
    p = target.node_p(node_codes, dtype)
    q_nodes = None
    if sampled:
        q_nodes = torch.cat([torch.zeros(1, q.shape[1], dtype=dtype), q[tree.depth[1:] - 1].to(dtype)])
        q_nodes = q_nodes[None].expand(b, -1, -1)
    return p, q_nodes, valid[None].expand(b, -1), has_next[None].expand(b, -1)


def _drafted(target: ToyTarget, q, tree: DraftTree, sampled: bool, n_rows: int, generator, depths_left):
    """q checked, ``n_rows`` rounds' drafts drawn as ``decode_frame`` draws them, and what verify gives:
    ``(node_codes, p, q_nodes, valid, has_next)`` (:func:`_round_inputs`)."""
    q = _pmf_rows(q, "q").to(torch.float32)
    _check_tree(tree, q, sampled)
    k, v = tree.max_depth, q.shape[1]
    if sampled:
        drafts = sample_drafts(q[:k][None].expand(n_rows, k, v).reshape(n_rows * k, v), generator).view(n_rows, k)
        node_codes = draft_node_codes(tree, q, drafts)
    else:
        node_codes = draft_node_codes(tree, q).expand(n_rows, -1).contiguous()
    return (node_codes, *_round_inputs(target, q, tree, node_codes, sampled, depths_left))


def toy_round(target: ToyTarget, q: torch.Tensor, tree: DraftTree, *, sampled: bool, n_rows: int,
              generator: torch.Generator, tolerance: float = 0.0, depths_left: int | None = None) -> ToyRound:
    """``n_rows`` independent rounds of draft -> verify -> accept -> commit on the toy, random numbers drawn as
    ``decode_frame`` draws them, accepted by :func:`rvqspec_lib.decoding.verify.walk_tree`.

    Args:
        target: the toy verifier. q: ``(K, V)`` draft distributions of offsets 1..K.
        tree: a chain for sampled drafts, any tree for point-mass drafts. sampled: drafts sampled from q, or the
            top-ranked codes. n_rows: rounds drawn. generator: explicit RNG. tolerance: 0, or SSD's LOSSY beta.
        depths_left: codes left in the frame after the root (default the tree's depth + 1: a bonus always exists).

    Raises:
        ValueError: a sampled tree that is not a chain, q too short for the tree, a rank past the vocabulary.
    """
    node_codes, p, q_nodes, valid, has_next = _drafted(target, q, tree, sampled, n_rows, generator, depths_left)
    walk = verify.walk_tree(p, node_codes, tree.children, valid, has_next, generator, q_nodes, tolerance)
    committed, n = committed_codes(walk, node_codes)
    return ToyRound(node_codes, p, q_nodes, walk, committed, n)


def trace_walk(p: torch.Tensor, node_codes: torch.Tensor, children: torch.Tensor, node_valid: torch.Tensor,
               has_next: torch.Tensor, generator: torch.Generator, q: torch.Tensor | None = None,
               tolerance: float = 0.0) -> tuple[verify.WalkResult, list[dict]]:
    """ONE row's walk through :func:`~rvqspec_lib.decoding.verify.walk_tree` with every try written out: the walk
    runs, then its random numbers are replayed from a copy of the generator's state against the same
    ``acceptance_ratio`` and ``residual``; the replayed path must equal the walk's. Arguments as ``walk_tree``'s.

    Returns:
        ``(walk, steps)``: per child tried ``{"parent", "node", "code", "p_x", "q_x", "ratio", "u", "accepted"}``,
        then ``{"node", "draw": "residual" | "bonus" | "none", "code", "distribution"}``.

    Raises:
        ValueError: more than one row. RuntimeError: the replay disagrees with the walk.
    """
    if p.shape[0] != 1:
        raise ValueError(f"trace_walk traces one row, got {p.shape[0]}")
    state = generator.get_state()
    walk = verify.walk_tree(p, node_codes, children, node_valid, has_next, generator, q, tolerance)
    replay = torch.Generator(device=p.device)
    replay.set_state(state)
    kids, valid = children.tolist(), node_valid[0].tolist()
    resid, cur, steps, path, rejected_here = p[:, 0].clone(), 0, [], [], False
    for _ in range(p.shape[1]):
        moved, rejected_here = False, False
        for c in kids[cur]:
            if c < 0:
                break
            if not valid[c]:
                continue
            x, q_c = node_codes[:, c], (q[:, c] if q is not None else None)
            ratio, q_x = _ratio(resid, x, q_c, tolerance)
            u = float(torch.rand(1, generator=replay, device=p.device))
            p_x = float(resid[0, x] / resid.sum())
            ok = u < ratio
            steps.append({"parent": cur, "node": c, "code": int(x), "p_x": p_x,
                          "q_x": 1.0 if q_x is None else float(q_x), "ratio": min(ratio, 1.0), "u": u, "accepted": ok})
            if ok:
                cur, resid, moved = c, p[:, c], True
                break
            resid, rejected_here = verify.residual(resid, x, q_c), True
        if not moved:
            break
        path.append(cur)
    if path != [int(i) for i in walk.path[0].tolist() if i >= 0]:
        raise RuntimeError(f"trace_walk replayed the path {path}, walk_tree took {walk.path[0].tolist()}: the order "
                           "of walk_tree's random draws changed; update trace_walk")
    nxt = bool(has_next[0, cur])
    steps.append({"node": cur, "draw": ("residual" if rejected_here else "bonus") if nxt else "none",
                  "code": int(walk.next_code[0]), "distribution": (resid[0] / resid.sum()).tolist() if nxt else None})
    return walk, steps


def trace_round(target: ToyTarget, q: torch.Tensor, tree: DraftTree, *, sampled: bool, generator: torch.Generator,
                depths_left: int | None = None) -> dict:
    """One lossless round (one row) of :func:`toy_round`, its walk written out by :func:`trace_walk` (a figure's
    data).

    Returns:
        a JSON-able dict: ``"nodes"`` (per node: ``node``, ``parent``, ``offset``, ``rank``, ``code``, ``q_x``,
        ``p_x`` under its parent's p, ``exists``), ``"steps"``, ``"committed"`` (per code: ``depth``, ``code``,
        ``how``: ``"accepted draft"``, ``"residual"`` or ``"bonus"``), ``"sampled"``, ``"n_committed"``.
    """
    node_codes, p, q_nodes, valid, has_next = _drafted(target, q, tree, sampled, 1, generator, depths_left)
    walk, steps = trace_walk(p, node_codes, tree.children, valid, has_next, generator, q_nodes)
    codes, n = committed_codes(walk, node_codes)
    par, c = tree.parent.tolist(), node_codes[0].tolist()
    nodes = [{"node": i, "parent": par[i], "offset": int(tree.depth[i]), "rank": int(tree.rank[i]),
              "code": c[i] if i else None, "q_x": float(q_nodes[0, i, c[i]]) if (sampled and i) else None,
              "p_x": float(p[0, par[i], c[i]]) if i else None, "exists": bool(valid[0, i])}
             for i in range(tree.n_nodes + 1)]
    n_acc, last = int(walk.n_accepted[0]), steps[-1]["draw"]
    committed = [{"depth": j + 1, "code": int(codes[0, j]), "how": "accepted draft" if j < n_acc else last}
                 for j in range(int(n[0]))]
    return {"nodes": nodes, "steps": steps, "committed": committed, "sampled": bool(sampled), "n_committed": int(n[0])}


def node_frequencies(walk: verify.WalkResult, n_nodes: int) -> torch.Tensor:
    """``(n_nodes + 1,)`` float64: the fraction of rows whose accepted path holds each node (the root: 1), the
    Monte Carlo estimate of :attr:`RoundLaw.node_accepted`."""
    rows = walk.path.shape[0]
    hits = torch.bincount(walk.path[walk.path >= 0].flatten(), minlength=n_nodes + 1).to(torch.float64)
    hits[0] = rows
    return hits / rows


@dataclass
class RoundLaw:
    """The exact law of one round (:func:`exact_round_law`).

    Attributes:
        outcomes: ``{committed codes (tuple): probability}``.
        node_tried: ``(M+1,)`` float64, probability that each node is tried (root: 1).
        node_accepted: ``(M+1,)`` float64, probability that each node is on the accepted path (root: 1).
        expected_committed: expected codes committed by the call (its tokens per call).
    """

    outcomes: dict
    node_tried: torch.Tensor
    node_accepted: torch.Tensor
    expected_committed: float = 0.0

    def length_pmf(self, max_len: int) -> torch.Tensor:
        """``(max_len + 1,)`` float64: probability that the call commits 0, 1, .., ``max_len`` codes."""
        out = torch.zeros(max_len + 1, dtype=torch.float64)
        for codes, pr in self.outcomes.items():
            out[len(codes)] += pr
        return out

    def first_code(self, vocab: int) -> torch.Tensor:
        """``(V,)`` law of the first code the round commits."""
        out = torch.zeros(vocab, dtype=torch.float64)
        for codes, pr in self.outcomes.items():
            if codes:
                out[codes[0]] += pr
        return out

    def completed_joint(self, target: ToyTarget, n_codes: int) -> torch.Tensor:
        """``(V,) * n_codes`` float64 joint law of the next ``n_codes`` codes, the round continued by AR sampling
        from the target: ``target.joint(n_codes)`` exactly for a lossless rule."""
        out = torch.zeros((target.vocab,) * n_codes, dtype=torch.float64)
        for codes, pr in self.outcomes.items():
            codes = codes[:n_codes]
            if codes:
                out[codes] += pr * target.continuation(codes[-1], n_codes - len(codes))
            else:  # a round that committed nothing (it started at the frame's last depth)
                out += pr * target.joint(n_codes)
        return out


def exact_round_law(target: ToyTarget, q: torch.Tensor, tree: DraftTree, *, sampled: bool, tolerance: float = 0.0,
                    depths_left: int | None = None) -> RoundLaw:
    """The exact :class:`RoundLaw` of one round by enumeration, in float64: every draft assignment (sampled: all
    ``V**K`` draws weighted by q), then every branch of the walk, with the rule's own ``acceptance_ratio`` and
    ``residual``. Arguments as :func:`toy_round`."""
    q = _pmf_rows(q, "q")
    _check_tree(tree, q, sampled)
    k, v, m1 = tree.max_depth, q.shape[1], tree.n_nodes + 1
    _, valid, has_next = _validity(tree, depths_left)
    kids = [[int(c) for c in row if c >= 0 and bool(valid[c])] for row in tree.children]
    outcomes: dict = {}
    tried = torch.zeros(m1, dtype=torch.float64)
    accepted = torch.zeros(m1, dtype=torch.float64)
    tried[0] = accepted[0] = 1.0
    if sampled:
        assignments = [(torch.tensor([xs]), math.prod(float(q[t, x]) for t, x in enumerate(xs)))
                       for xs in itertools.product(range(v), repeat=k)]
        assignments = [(draft_node_codes(tree, q, d), w) for d, w in assignments if w > 0]
    else:
        assignments = [(draft_node_codes(tree, q), 1.0)]

    for node_codes, weight in assignments:
        p, q_nodes, _, _ = _round_inputs(target, q, tree, node_codes, sampled, depths_left, torch.float64)

        def finish(cur, resid, prob, path):
            if bool(has_next[cur]):
                dist = resid[0] / resid[0].sum()
                for y in range(v):
                    if float(dist[y]) > 0:
                        key = path + (y,)
                        outcomes[key] = outcomes.get(key, 0.0) + prob * float(dist[y])
            else:
                outcomes[path] = outcomes.get(path, 0.0) + prob

        def try_child(cur, i, resid, prob, path):
            if i == len(kids[cur]):
                return finish(cur, resid, prob, path)
            c = kids[cur][i]
            x, q_c = node_codes[:, c], (None if q_nodes is None else q_nodes[:, c])
            a = min(_ratio(resid, x, q_c, tolerance)[0], 1.0)
            tried[c] += prob
            if a > 0:
                accepted[c] += prob * a
                try_child(c, 0, p[:, c], prob * a, path + (int(x),))
            if a < 1:
                try_child(cur, i + 1, verify.residual(resid, x, q_c), prob * (1 - a), path)

        try_child(0, 0, p[:, 0], weight, ())
    expected = sum(len(codes) * pr for codes, pr in outcomes.items())
    return RoundLaw(outcomes, tried, accepted, float(expected))


def g_test(counts, pmf, *, min_expected: float = MIN_EXPECTED) -> dict:
    """G-test (log-likelihood ratio) of ``counts`` against an exact ``pmf`` of the same bins (any shape): bins of
    probability 0 dropped, unless observed (p-value 0: an impossible outcome); bins of expected count below
    ``min_expected`` pooled, as in tests/test_lossless.py. Returns ``{"g", "df", "p_value", "n"}``.

    Raises:
        ValueError: counts and pmf of different sizes.
    """
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
    pmf = torch.as_tensor(pmf, dtype=torch.float64).flatten()
    if counts.shape != pmf.shape:
        raise ValueError(f"counts and pmf must have the same number of bins, got {counts.numel()} and {pmf.numel()}")
    n = float(counts.sum())
    if float(counts[pmf <= 0].sum()) > 0:
        return {"g": math.inf, "df": -1, "p_value": 0.0, "n": int(n)}
    keep = pmf > 0
    expected = (pmf[keep] / pmf[keep].sum() * n).tolist()
    observed = counts[keep].tolist()
    order = sorted(range(len(expected)), key=lambda i: expected[i])
    small = [i for i in order if expected[i] < min_expected]
    big = [i for i in order if expected[i] >= min_expected]
    while small and sum(expected[i] for i in small) < min_expected and big:
        small.append(big.pop(0))
    e = [expected[i] for i in big] + ([sum(expected[i] for i in small)] if small else [])
    o = [observed[i] for i in big] + ([sum(observed[i] for i in small)] if small else [])
    if len(e) < 2:
        return {"g": 0.0, "df": 0, "p_value": 1.0, "n": int(n)}
    g, pval = stats.power_divergence(o, e, lambda_="log-likelihood")
    return {"g": float(g), "df": len(e) - 1, "p_value": float(pval), "n": int(n)}


def g_test_power(n: int, df: int, *, tv: float, level: float) -> float:
    """Power of the level-``level`` G-test with ``df`` degrees of freedom and ``n`` samples against ANY shift of total
    variation ``tv``: at least ``ncx2.sf(chi2.isf(level, df), df, n (2 tv)^2)`` (Cauchy-Schwarz bound on the
    noncentrality; docs/methods.md#testing-wer-parity, tests/test_lossless.py)."""
    return float(stats.ncx2.sf(stats.chi2.isf(level, df), df, n * (2 * tv) ** 2))
