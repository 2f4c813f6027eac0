"""The fused speculative TREE round: a point-mass draft tree, draft -> verify -> accept -> commit as ONE graph a round.

:class:`FusedTreeFrame` decodes a frame as :func:`rvqspec_lib.decoding.decode.decode_frame` does with
``decoder=Tree(paths)`` (point-mass drafts, the reused heads as drafter; a calibrated tree is such a tree), with the
frame loop, the prefill, the compiled-graph bookkeeping and the uniforms of
:class:`~rvqspec_lib.models.fused_spec.FusedChainFrame` (docs/methods.md#the-fused-speculative-round). A round after
committed code s, with s a Python int (one graph per start depth):

1. draft: the tree's nodes whose depth s + t stays within the frame (the topology for start depth s, fixed), node
   (t, r) drafting the rank-r code of ``lm_head[s+t-1](H_s)`` (``torch.topk`` of the logits, as ``decode.draft``);
2. verify: ONE call of the lean layer stack over the root (code s, slot s+1) and the nodes that have a code after
   them (node m at slot s+1+m, position s+1+t), each attending to the committed slots 0..s, the root and its own
   ancestors; p of every fed node from ``lm_head[s+t]``;
3. accept: the point-mass walk of :func:`rvqspec_lib.decoding.verify.walk_tree` (children tried in rank order;
   child x accepted with probability ``p(x) / sum(p)`` of the remaining mass; on rejection x's mass is set to 0; on
   acceptance the walk moves to the child's p), unrolled over the tree's levels and children with no host check;
   then the next code from the remaining mass (after a rejection or at a leaf), none past the last depth;
4. commit: the accepted path's codes and the next code written by column; the accepted nodes' keys and values moved
   to slots s+2.. (a gather over the slot axis: the path may skip slots), the last accepted node's hidden state
   returned for the next round.

Uniforms: ``(B, n_codes, D * C + 1)`` float64 with D the tree's depth and C its largest number of children, drawn up
front in one ``torch.rand``; block ``U[b, s]`` belongs to the round after committed code s: ``U[b, s, (t-1) C + i]``
tests the i-th child tried at level t, ``U[b, s, D C]`` draws the next code; ``U[b, 0, 0]`` draws code 1 in the
prefill. Entries a round does not use are skipped, never shifted (a row's codes depend on its own uniforms only).

What is tested (tests/test_fused_tree.py): greedy codes equal AR's; compiled equals eager code for code for the same
uniforms; the joint distribution of the codes equals the exact AR pmf (G-test), and a walk that does not remove a
rejected child's mass is rejected by the same test.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rvqspec_lib.models.fused_spec import FusedChainFrame, inverse_cdf
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.decoding.trees import DraftTree


def point_mass_residual(resid: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``resid`` ``(B, V)`` with code ``x`` ``(B,)`` set to 0 (a rejected point-mass draft); a row left with no mass
    keeps ``resid`` (as :func:`rvqspec_lib.decoding.verify.residual`). Module-level so a negative control can replace
    it (eager only)."""
    out = resid.scatter(1, x[:, None], 0.0)
    return torch.where(out.sum(-1, keepdim=True) > 0, out, resid)


def point_mass_acceptance(resid: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``resid(x) / sum(resid)`` for ``(B, V)`` remaining mass and ``(B,)`` codes: the probability of accepting a
    point-mass draft (:func:`rvqspec_lib.decoding.verify.acceptance_ratio` with ``q_x=None``). Module-level so a
    negative control can replace it (eager only)."""
    return resid.gather(1, x[:, None]).squeeze(1) / resid.sum(-1).clamp_min(1e-30)


class FusedTreeFrame(FusedChainFrame):
    """Point-mass tree speculation with one compiled graph per round (see the module docstring).

    Args:
        code_predictor: the official module (its parameters are read in place), in any precision of
            :mod:`rvqspec_lib.models.precision`.
        tree: a :class:`~rvqspec_lib.decoding.trees.DraftTree`, a ``Tree(sampled=False)`` decoder or rank paths.
        sampling, matmul, compile, compile_options: as :class:`~rvqspec_lib.models.fused_spec.FusedChainFrame`.

    Raises:
        ValueError: a sampled tree (its drafts are drawn, not ranked: use ``Chain`` or ``decode_frame``), a tree
            deeper than 8 or with a rank outside the codebook, ``top_p < 1``.
    """

    def __init__(self, code_predictor, tree, sampling: Sampling | None = None, *, matmul: str = "torch",
                 compile: bool = True, compile_options: dict | None = None):
        if getattr(tree, "sampled", False):
            raise ValueError("the fused tree round takes point-mass trees (Tree(paths, sampled=False)); a sampled "
                             "tree runs through decode_frame")
        tree = tree.tree(0) if hasattr(tree, "tree") else tree
        tree = tree if isinstance(tree, DraftTree) else DraftTree.from_paths(tree)
        if not 1 <= tree.max_depth <= 8:
            raise ValueError(f"the fused tree round takes trees of depth 1..8, got {tree.max_depth}")
        super().__init__(code_predictor, tree.max_depth + 1, sampling, matmul=matmul, compile=compile,
                         compile_options=compile_options)
        if tree.max_rank >= self.vocab:
            raise ValueError(f"tree rank {tree.max_rank} is out of range for a codebook of {self.vocab} codes: "
                             f"use ranks 0..{self.vocab - 1}")
        self.tree = tree
        # the topology as Python ints (a round reads them while it is traced: no tensor may decide a shape)
        self._depth, self._parent = tree.depth.tolist(), tree.parent.tolist()
        self._rank, self._children = tree.rank.tolist(), tree.children.tolist()
        self.C = int(tree.children.shape[1])
        self.D = tree.max_depth
        self.u_width = self.D * self.C + 1
        self.slots = self.n_codes + 2 + tree.n_nodes  # committed slots 0..s, the root at s+1, node m at s+1+m
        self.nodes = tree.n_nodes + 1  # the node budget N of a verify call (the root included)
        self.decoder_label = f"fused-tree{self.nodes}"  # the decoder column of a timing row
        self.name = f"fused-tree{tree.n_nodes + 1}" + ("-mgemv" if matmul == "mgemv" else "") + \
            ("-compiled" if compile else "")

    def _tree_mask(self, s: int, fed: list[int], b: int, device) -> torch.Tensor:
        """Additive mask ``(B, 1, Q, slots)`` of the verify call at start depth s over the fed nodes ``fed`` (node
        indices, the root first): slots 0..s, the root's slot s+1 and the node's ancestors' slots."""
        allow = torch.zeros(len(fed), self.slots, dtype=torch.bool)
        allow[:, :s + 2] = True  # committed slots and the root
        for qi, m in enumerate(fed):
            j = m
            while j > 0:
                allow[qi, s + 1 + j] = True
                j = self._parent[j]
        mask = torch.zeros(len(fed), self.slots, dtype=self.lean.dtype).masked_fill(~allow, self.lean.mask_min)
        return mask.to(device)[None, None].expand(b, 1, len(fed), self.slots)

    def round(self, s: int, codes: torch.Tensor, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              u: torch.Tensor):
        """One tree round after committed code ``s`` (what is compiled, one graph per s). Arguments and result as
        :meth:`FusedChainFrame.round` (``u``: ``(B, n_codes, D C + 1)``); the caches are updated in place."""
        cp, n, lean = self.code_predictor, self.n_codes, self.lean
        b, dev = codes.shape[0], codes.device
        rows = torch.arange(b, device=dev)
        ur = u[:, s]
        depth, rank = self._depth, self._rank
        nodes = [m for m in range(len(depth)) if s + depth[m] <= n]  # the topology at start depth s
        fed = [m for m in nodes if s + depth[m] < n]  # nodes with a code after them (the root always)
        pos = {m: i for i, m in enumerate(nodes)}
        # 1. draft: rank r of offset t's logits
        n_off = max(depth[m] for m in nodes)
        node_code = [codes[:, s - 1]]
        if n_off:
            r_max = max(rank[m] for m in nodes[1:]) + 1
            top = [torch.topk(self._head(h, s + t - 1), r_max, dim=-1).indices for t in range(1, n_off + 1)]
            node_code += [top[depth[m] - 1][:, rank[m]] for m in nodes[1:]]
        node_codes = torch.stack(node_code, 1)  # (B, M'+1), in the order of `nodes`
        # 2. verify
        emb = torch.stack([F.embedding(node_codes[:, pos[m]], cp.model.codec_embedding[s - 1 + depth[m]].weight)
                           for m in fed], 1)
        x = cp.small_to_mtp_projection(emb)
        q_len = len(fed)
        p_idx = torch.tensor([s + 1 + depth[m] for m in fed], device=dev)
        cos = lean.cos[p_idx][None, None].expand(b, 1, q_len, -1)
        sin = lean.sin[p_idx][None, None].expand(b, 1, q_len, -1)
        write = torch.tensor([s + 1 + m for m in fed], device=dev)[None, None, :, None]
        write = write.expand(b, lean.n_kv, q_len, lean.head_dim)
        hid = lean.stack(x, cos, sin, self._tree_mask(s, fed, b, dev), write, k, v)  # (B, Q, H)
        ones = torch.ones(b, self.vocab, dtype=torch.float32, device=dev)  # p of a node with no code after it
        p = torch.stack([self.probs(self._head(hid[:, fed.index(m)], s + depth[m])) if m in fed else ones
                         for m in nodes], 1)  # (B, M'+1, V)
        # 3. accept: the point-mass walk, unrolled (children tables restricted to the nodes present)
        kids = [[pos[c] for c in self._children[m] if c >= 0 and c in pos] for m in nodes]
        children = torch.full((len(nodes), self.C), -1, dtype=torch.long)
        for i, ch in enumerate(kids):
            children[i, :len(ch)] = torch.tensor(ch, dtype=torch.long)
        children = children.to(dev)
        cur = torch.zeros(b, dtype=torch.long, device=dev)
        alive = torch.ones(b, dtype=torch.bool, device=dev)
        resid = p[:, 0]
        path = []
        for level in range(n_off):
            moved = torch.zeros(b, dtype=torch.bool, device=dev)
            for i in range(self.C):
                c = children[cur, i]
                cc = c.clamp_min(0)
                ok = alive & ~moved & (c >= 0)
                xc = node_codes[rows, cc]
                acc = ok & (ur[:, level * self.C + i] < point_mass_acceptance(resid, xc))
                rej = ok & ~acc
                resid = torch.where(rej[:, None], point_mass_residual(resid, xc), resid)
                cur = torch.where(acc, c, cur)
                resid = torch.where(acc[:, None], p[rows, cc], resid)
                moved = moved | acc
            alive = alive & moved
            path.append(torch.where(alive, cur, torch.full_like(cur, -1)))
        n_acc = torch.stack(path, 1).ge(0).sum(1) if path else torch.zeros_like(cur)
        depth_t = torch.tensor([s + depth[m] for m in nodes], device=dev)
        has_next = depth_t[cur] < n
        nxt = inverse_cdf(resid, ur[:, self.D * self.C])
        # 4. commit: columns s..s+width-1 hold depths s+1..s+width
        width = min(n_off + 1, n - s)
        block = []
        for d in range(width):
            drafted = node_codes[rows, path[d].clamp_min(0)] if d < len(path) else nxt
            keep = codes[:, s + d]
            block.append(torch.where(d < n_acc, drafted, torch.where((d == n_acc) & has_next, nxt, keep)))
        codes = torch.cat([codes[:, :s], torch.stack(block, 1), codes[:, s + width:]], 1)
        # the accepted nodes' KV to slots s+2.. (slot s+1+d <- slot s+1+node of level d); other slots unchanged
        slot = torch.arange(self.slots, device=dev)[None, :].expand(b, self.slots)
        node_slot = torch.tensor([s + 1 + m for m in nodes], device=dev)
        order = slot
        for d in range(1, len(path) + 1):
            src = torch.where(d <= n_acc, node_slot[path[d - 1].clamp_min(0)], slot[:, s + 1 + d])
            order = torch.where(slot == s + 1 + d, src[:, None], order)
        idx = order[None, :, None, :, None].expand_as(k)
        k.copy_(k.gather(3, idx))
        v.copy_(v.gather(3, idx))
        committed = n_acc + has_next.to(torch.int64)
        fed_row = torch.tensor([fed.index(m) if m in fed else 0 for m in nodes], device=dev)
        h = hid[rows, fed_row[cur]]
        return codes, committed, h
