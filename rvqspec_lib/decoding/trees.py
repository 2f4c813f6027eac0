"""A draft tree as data: rank paths compiled once into buffers (paper §2.2; docs/methods.md#the-tree-as-data)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch


def parse_paths(text: str) -> list[tuple[int, ...]]:
    """Parse the CLI form ``"0;1;0,0;0,0,0"`` (paths separated by ``;``, ranks by ``,``); else ValueError."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty tree: give rank paths like '0;1;0,0;0,0,0'")
    out = []
    for part in text.strip().rstrip(";").split(";"):
        part = part.strip()
        if not part:
            raise ValueError(f"empty path in tree {text!r}: separate paths with single ';', e.g. '0;1;0,0'")
        try:
            out.append(tuple(int(x) for x in part.split(",")))
        except ValueError:
            raise ValueError(f"bad tree path {part!r}: ranks are integers separated by ',' e.g. '0;1;0,0'") from None
    return out


@dataclass(frozen=True)
class DraftTree:
    """A compiled draft tree (node 0 = the root, the last committed code): the non-root ``paths`` in node order (by
    length, then lexicographic); int64 ``(M+1,)`` ``parent`` (-1: root), ``depth`` (offset t), ``rank`` (-1: root);
    ``children`` ``(M+1, C)`` in rank order, -1 padded; ``ancestors`` ``(M+1, M+1)`` bool, the tree attention mask
    (``[i, j]``: j is i or an ancestor of i)."""

    paths: tuple[tuple[int, ...], ...]
    parent: torch.Tensor
    depth: torch.Tensor
    rank: torch.Tensor
    children: torch.Tensor
    ancestors: torch.Tensor

    @property
    def n_nodes(self) -> int:
        """Non-root nodes M (the node budget N is M + 1)."""
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        """The deepest offset drafted (0 for a tree of the root alone)."""
        return int(self.depth.max()) if self.n_nodes else 0

    @property
    def max_rank(self) -> int:
        """The largest rank drafted (-1 for the root alone)."""
        return int(self.rank.max()) if self.n_nodes else -1

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]]) -> "DraftTree":
        """Compile rank paths (``[(0,), (1,), (0, 0)]``; an int ``r`` is the path ``(r,)``). Raises ValueError: a
        path that is empty, has a negative or non-integer rank, is repeated, or has a gap."""
        norm: list[tuple[int, ...]] = []
        for p in paths:
            if isinstance(p, int):
                p = (p,)
            try:
                if any(isinstance(r, bool) for r in p):
                    raise TypeError
                t = tuple(int(r) for r in p)
            except (TypeError, ValueError):
                raise ValueError(f"tree path {p!r} is not a sequence of integer ranks") from None
            if not t:
                raise ValueError("empty tree path: every path names at least one rank, e.g. (0,)")
            if any(r < 0 for r in t) or any(int(r) != r for r in p):
                raise ValueError(f"tree path {p!r} has a negative or non-integer rank")
            norm.append(t)
        if len(set(norm)) != len(norm):
            dup = sorted({p for p in norm if norm.count(p) > 1})
            raise ValueError(f"tree paths repeated: {dup}")
        s = set(norm)
        for p in norm:
            if len(p) > 1 and p[:-1] not in s:
                raise ValueError(f"tree path {p} has a gap: its prefix {p[:-1]} is not in the tree; add it")
        order = sorted(norm, key=lambda p: (len(p), p))
        index = {(): 0, **{p: i for i, p in enumerate(order, start=1)}}
        m = len(order)
        parent = torch.full((m + 1,), -1, dtype=torch.long)
        depth = torch.zeros(m + 1, dtype=torch.long)
        rank = torch.full((m + 1,), -1, dtype=torch.long)
        kids: list[list[int]] = [[] for _ in range(m + 1)]
        for p in order:
            i = index[p]
            parent[i] = index[p[:-1]]
            depth[i] = len(p)
            rank[i] = p[-1]
            kids[index[p[:-1]]].append(i)  # order is lexicographic, so children arrive in rank order
        c = max((len(k) for k in kids), default=0)
        children = torch.full((m + 1, max(c, 1)), -1, dtype=torch.long)
        for i, k in enumerate(kids):
            children[i, : len(k)] = torch.tensor(k, dtype=torch.long)
        anc = torch.zeros(m + 1, m + 1, dtype=torch.bool)
        for i in range(m + 1):
            j = i
            while j >= 0:
                anc[i, j] = True
                j = int(parent[j])
        return cls(tuple(order), parent, depth, rank, children, anc)

    @classmethod
    def chain(cls, n_drafts: int) -> "DraftTree":
        """A single path of ``n_drafts`` nodes (rank 0 at every offset): a Chain's verify call."""
        return cls.from_paths([(0,) * t for t in range(1, n_drafts + 1)])


def grow_tree(values, n_nodes: int, *, sampled: bool) -> list[tuple[int, ...]]:
    """The tree of ``n_nodes`` non-root nodes maximising expected tokens per call, grown greedily on the product of
    ``values`` along each path (docs/methods.md#building-a-tree); ties go to the shorter, then smaller path.

    Args:
        values: ``(K, C)`` floats in [0, 1]: per offset, the acceptance of rank (or, ``sampled``, child index) c
            once its parent is reached; a sampled child i opens only once child i-1 is in the tree.

    Returns:
        The rank paths in the order added (every prefix is a valid tree).
    Raises:
        ValueError: an empty or ragged table, values outside [0, 1] or NaN, ``n_nodes < 1``.
    """
    rows = [list(map(float, r)) for r in values]
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("values must be a non-empty (offsets, ranks) table with rows of equal length")
    if any(not (0.0 <= v <= 1.0) or math.isnan(v) for r in rows for v in r):
        raise ValueError("values must be probabilities in [0, 1] (no NaN): pool the calibration tables first")
    if not isinstance(n_nodes, int) or n_nodes < 1:
        raise ValueError(f"n_nodes must be an integer >= 1, got {n_nodes!r}")
    k_max, c_max = len(rows), len(rows[0])
    heap: list = []

    def offer(parent: tuple[int, ...], parent_value: float, index: int) -> None:
        t = len(parent) + 1
        if t <= k_max and index < c_max:
            path = parent + (index,)
            heapq.heappush(heap, (-parent_value * rows[t - 1][index], len(path), path))

    def open_children(path: tuple[int, ...], value: float) -> None:
        for i in ([0] if sampled else range(c_max)):
            offer(path, value, i)

    open_children((), 1.0)
    out: list[tuple[int, ...]] = []
    while heap and len(out) < n_nodes:
        neg, _, path = heapq.heappop(heap)
        out.append(path)
        open_children(path, -neg)
        if sampled:  # the next sibling becomes available
            parent = path[:-1]
            pv = math.prod(rows[j][i] for j, i in enumerate(parent))
            offer(parent, pv, path[-1] + 1)
    return out


def expected_tokens(paths, values) -> float:
    """Expected tokens of one call under :func:`grow_tree`'s model (frame end ignored)."""
    rows = [list(map(float, r)) for r in values]
    return 1.0 + sum(math.prod(rows[j][i] for j, i in enumerate(p)) for p in paths)
