"""Timing replay: an acceptance oracle that replaces the accept test of the decode round, and NOTHING else.

A real-size architecture with random weights (``qwen3-tts-0.6b-random``) times real verify calls, but its p and q
agree on almost nothing, so a speculative frame on it accepts almost no draft and its time says nothing about a
trained model. :class:`AcceptanceOracle` decides acceptance instead from a table measured on a trained model
(docs/precision.md#timing-replay): every other step of :func:`rvqspec_lib.decoding.decode.decode_frame` (prefill,
draft, the verify call with the decoder's shapes, commit) runs unchanged, so the frame makes the calls a trained
model of that architecture would make, in distribution.

The table holds, for start depth s (the depth of the last committed code, 1..n-1), draft offset t (1..K) and child
index i (a point-mass tree's rank r, or a sampled tree's / chain's i-th child drawn), the probability that the walk
accepts that child once it has reached its parent, the quantity the tree calibration tabulates
(:mod:`rvqspec_lib.eval.calibration`: ``rank_mass`` for point-mass children, ``child_accept`` for sampled ones). At a
reached node one uniform from the oracle's OWN generator picks the accepted child: child j with probability
``table[s, t, i_j]`` in the order the children are tried, or none with the rest. Children of one node are disjoint
events (the sampled code is at most one of them), which is what makes this one categorical draw the calibration's
model of a walk (offsets independent given the start depth: the Medusa / paper calibration model). Ranks or child
indices beyond the table, offsets beyond it and NaN entries (s + t > n) accept with probability 0. The code after
the accepted path is drawn from the verifier's p after the last accepted node (the real walk draws from a residual;
these codes mean nothing here).

What it is not: a decoder. Its codes are not samples of anything, so :func:`decode_frame` SEALS a replayed frame:
``FrameResult.codes`` is all -1 (no codec embeds them) and ``FrameResult.replay`` carries the label. The decoding
generator (drafts, prefill) is the caller's; the oracle's uniforms come from its own seeded generator, so the
decoder's random stream is the one a real frame draws up to the accept step.

No files here (the decoding layer): tables come as tensors; reading and checking them is
:mod:`rvqspec_lib.eval.replay`.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from rvqspec_lib.decoding.verify import WalkResult

#: The two kinds of children, as the calibration names them: top-ranked (point-mass) and sampled.
KINDS = ("point-mass", "sampled")


class AcceptanceOracle:
    """Replayed acceptance decisions (module docstring).

    Args:
        tables: ``{"point-mass": (n-1, K, C), "sampled": (n-1, K', C')}`` float64 tensors or nested lists:
            ``table[s-1, t-1, i]`` = the probability that child i at offset t from start depth s is accepted once
            its parent is reached. A kind a run never meets may be absent (a point-mass tree needs ``point-mass``;
            chains and sampled trees need ``sampled``).
        label: what the table is, e.g. ``"embedded model (trees/heads.json)"``; :attr:`text` says
            ``timing replay: acceptance of <label>, weights random``.
        seed: seed of the oracle's own generator.

    Raises:
        ValueError: an unknown kind, no table, a table that is not 3-d, a value outside [0, 1], children of one node
            whose probabilities add up to more than 1 (for some s, t).
    """

    def __init__(self, tables: Mapping[str, object], label: str, *, seed: int = 0):
        if not tables or any(k not in KINDS for k in tables):
            raise ValueError(f"acceptance tables must be given for some of {', '.join(KINDS)}, got {list(tables)}")
        self.tables: dict[str, list] = {}
        for kind, t in tables.items():
            a = torch.as_tensor(t, dtype=torch.float64)
            if a.dim() != 3 or min(a.shape) < 1:
                raise ValueError(f"the {kind} acceptance table must be (start depths, offsets, children), got shape "
                                 f"{tuple(a.shape)}")
            finite = a[torch.isfinite(a)]
            if finite.numel() and (float(finite.min()) < 0 or float(finite.max()) > 1):
                raise ValueError(f"the {kind} acceptance table holds a value outside [0, 1]")
            if float(torch.nan_to_num(a, nan=0.0).sum(-1).max()) > 1 + 1e-6:
                raise ValueError(f"the {kind} acceptance table's children of one node add up to more than 1")
            self.tables[kind] = torch.nan_to_num(a, nan=0.0).tolist()  # Python floats: one lookup per child tried
        self.label = str(label)
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self._plans: dict = {}

    @property
    def text(self) -> str:
        """The words every output of a replay carries: ``timing replay: acceptance of <label>, weights random``."""
        return f"timing replay: acceptance of {self.label}, weights random"

    def probability(self, kind: str, start_depth: int, offset: int, index: int) -> float:
        """The table's entry for (kind, start depth s >= 1, offset t >= 1, child index i >= 0); 0 outside it.

        Raises:
            ValueError: a kind this oracle has no table for (a point-mass tree replayed with only sampled tables).
        """
        if kind not in self.tables:
            raise ValueError(f"this replay has no {kind} acceptance table: pass one with both kinds "
                             "(rvqspec bench --acceptance FILE; docs/precision.md#timing-replay)")
        t = self.tables[kind]
        if not (1 <= start_depth <= len(t) and 1 <= offset <= len(t[0]) and 0 <= index < len(t[0][0])):
            return 0.0
        v = t[start_depth - 1][offset - 1][index]
        return 0.0 if math.isnan(v) else v

    def _static(self, plan) -> tuple:
        key = id(plan)
        got = self._plans.get(key)
        if got is None or got[0] is not plan:
            kids = [[c for c in row if c >= 0] for row in plan.children.tolist()]
            index = [0] + plan.rank.tolist()  # a node's rank (point-mass) or child index (sampled): its last path entry
            got = (plan, kids, index, plan.depth.tolist(), "sampled" if plan.sampled else "point-mass")
            self._plans[key] = got
        return got[1:]

    def walk(self, plan, state, drafted, verified) -> WalkResult:
        """The accept step of one round, replayed: the same :class:`~rvqspec_lib.decoding.verify.WalkResult` the
        lossless walk returns (``path``, ``n_accepted``, ``last_node``, ``next_code``), decided from the table.

        Args:
            plan: the round's :class:`~rvqspec_lib.decoding.decode.RoundPlan`. state: the
                :class:`~rvqspec_lib.decoding.decode.FrameState` (its ``s`` ``(B,)`` is the start depth).
            drafted: the round's draft (unused: the decision does not look at the codes). verified: the verify
                call's outcome (``node_valid``, ``fed`` ``(B, M+1)`` bool; ``p`` ``(B, M+1, V)`` for the next code).
        """
        kids, index, depth, kind = self._static(plan)
        b = verified.p.shape[0]
        dev = verified.p.device
        levels = max(plan.tree.max_depth, 1)
        u = torch.rand(b, levels, generator=self.generator, dtype=torch.float64).tolist()
        valid, fed, starts = verified.node_valid.tolist(), verified.fed.tolist(), state.s.tolist()
        paths, last = [], []
        for row in range(b):
            cur, path = 0, []
            for level in range(levels):
                acc, chosen = 0.0, None
                for c in kids[cur]:
                    if not valid[row][c]:
                        continue
                    acc += self.probability(kind, starts[row], depth[c], index[c])
                    if u[row][level] < acc:
                        chosen = c
                        break
                if chosen is None:
                    break
                cur = chosen
                path.append(cur)
            paths.append(path)
            last.append(cur)
        width = max((len(p) for p in paths), default=0)
        path_t = torch.full((b, width), -1, dtype=torch.long)
        for row, p in enumerate(paths):
            if p:
                path_t[row, : len(p)] = torch.tensor(p)
        last_t = torch.tensor(last, dtype=torch.long)
        nxt = torch.tensor([fed[row][last[row]] for row in range(b)], dtype=torch.bool)
        p_last = verified.p[torch.arange(b, device=dev), last_t.to(dev)].float().cpu()
        safe = torch.where(nxt[:, None], p_last, torch.ones_like(p_last))
        code = torch.multinomial(safe, 1, generator=self.generator).squeeze(1)
        code = torch.where(nxt, code, torch.full_like(code, -1))
        return WalkResult(path_t.to(dev), (path_t >= 0).sum(1).to(dev), last_t.to(dev), code.to(dev))

    def seal(self, result):
        """A replayed frame's :class:`~rvqspec_lib.decoding.decode.FrameResult` with its codes set to -1 (no codec
        embeds them: a replay never produces audio) and ``replay`` set to :attr:`text`; calls and per-call logs
        kept (what a timing needs)."""
        import dataclasses

        return dataclasses.replace(result, codes=torch.full_like(result.codes, -1), replay=self.text)

    def __repr__(self) -> str:
        return f"AcceptanceOracle({self.text!r}, seed={self.seed})"
