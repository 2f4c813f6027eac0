"""The inner-loop decoders (docs/methods.md#decoding-methods): :class:`AR`, :class:`Chain`, :class:`Tree` and the
LOSSY control :class:`LossySSD`; each says which tree a verify call checks and whether drafts are sampled. torch is
imported only when a tree is compiled (the command line reads these constants for its help without it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from rvqspec_lib.decoding.trees import DraftTree

#: Largest chain window: the committed code plus up to 7 drafts.
MAX_WINDOW = 8
#: Chain windows swept by evaluations (eval-acceptance without --decoder, notebook 03): 2..MAX_WINDOW.
CHAIN_WINDOWS = tuple(range(2, MAX_WINDOW + 1))
#: Window of ``Chain()`` and of ``--decoder chain`` without ``:N``.
DEFAULT_WINDOW = 4
#: Default sparse tree (``Tree()``'s and the command line's): top-2 one step ahead, the top code two and three steps
#: ahead below the first.
DEFAULT_TREE = ((0,), (1,), (0, 0), (0, 0, 0))


def _trees():
    """:class:`~rvqspec_lib.decoding.trees.DraftTree`, imported on first use."""
    from rvqspec_lib.decoding.trees import DraftTree

    return DraftTree


@dataclass(frozen=True)
class AR:
    """Autoregressive decoding: one code-predictor call per code (15 per frame), 1.00 token per call."""

    def tree(self, n_codes: int) -> DraftTree:
        """The empty tree: the root alone."""
        return _trees().from_paths([])

    sampled_drafts = False
    #: Query positions of one call (the node budget N).
    nodes = 1


@dataclass(frozen=True)
class Chain:
    """Chain speculation with sampled drafts (docs/methods.md#chain-with-sampled-drafts): ``window`` N = the committed
    code plus N-1 drafts. ``drafter``: as :class:`Tree`'s. Raises ValueError: window outside 2..:data:`MAX_WINDOW`."""

    window: int = DEFAULT_WINDOW
    drafter: object = field(default=None, repr=False, kw_only=True)

    def __post_init__(self):
        if not isinstance(self.window, int) or isinstance(self.window, bool) or not 2 <= self.window <= MAX_WINDOW:
            raise ValueError(f"Chain window must be an integer in 2..{MAX_WINDOW} (the committed code plus "
                             f"1..{MAX_WINDOW - 1} drafts), got {self.window!r}")

    def tree(self, n_codes: int) -> DraftTree:
        """One path of ``window - 1`` nodes (nodes past the last depth are masked by the decode loop)."""
        return _trees().chain(self.window - 1)

    sampled_drafts = True

    @property
    def nodes(self) -> int:
        """Query positions of one verify call (the node budget N): the window."""
        return self.window


@dataclass(frozen=True)
class Tree:
    """Sparse-tree speculation: draft paths verified in ONE masked call (paper §2.2). Point-mass children, the
    top-ranked codes of q (docs/methods.md#sparse-point-mass-tree), or children sampled from q without replacement,
    a path's entries then child indices (docs/methods.md#sampled-trees).

    Args:
        paths: rank (or child-index) paths, e.g. ``[(0,), (1,), (0, 0), (0, 0, 0)]``. sampled: sampled children.
        drafter: the drafter it drafts with (``None``: the caller's, by default the reused heads).

    Raises:
        ValueError: an empty tree, a path with a gap, a negative rank, a repeated path; for a sampled tree, a child
            index i without the siblings 0..i-1 (children are drawn in order).
    """

    paths: Sequence[Sequence[int]] = DEFAULT_TREE
    sampled: bool = False
    drafter: object = field(default=None, repr=False, kw_only=True)
    _compiled: DraftTree = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.paths is None or len(list(self.paths)) == 0:
            raise ValueError("Tree needs at least one rank path, e.g. Tree(paths=[(0,), (1,), (0, 0)])")
        object.__setattr__(self, "paths", tuple(tuple(p) if not isinstance(p, int) else (p,) for p in self.paths))
        object.__setattr__(self, "_compiled", _trees().from_paths(self.paths))
        if self.sampled:
            have = set(self._compiled.paths)
            for path in self._compiled.paths:
                if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in have:
                    raise ValueError(f"sampled tree path {path}: child {path[-1]} needs its sibling "
                                     f"{path[:-1] + (path[-1] - 1,)} (children are sampled in order); add it")

    def tree(self, n_codes: int) -> DraftTree:
        """The compiled tree, whatever ``n_codes`` (nodes past the last depth are masked)."""
        return self._compiled

    @property
    def sampled_drafts(self) -> bool:
        """Whether drafts are sampled from q (or the top-ranked codes)."""
        return self.sampled

    @property
    def nodes(self) -> int:
        """Query positions of one verify call (the node budget N): the root plus the tree's nodes."""
        return len(self.paths) + 1


@dataclass(frozen=True)
class LossySSD:
    """LOSSY control, NOT distribution-preserving: a :class:`Chain` accepting when ``u < min(1, p/q) + beta``
    (SSD's tolerance rule, docs/methods.md#ssd-tolerance-rule-a-lossy-control; SSD's main setting: window 4, beta
    0.4). Raises ValueError: window outside 2..8, beta outside (0, 1]."""

    window: int = 4
    beta: float = 0.4
    drafter: object = field(default=None, repr=False, kw_only=True)

    #: whether the decoder preserves the target distribution (False: the output is NOT distributed as p)
    lossless = False
    sampled_drafts = True

    def __post_init__(self):
        Chain(self.window)  # the same window check, the same message
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not 0 < float(self.beta) <= 1:
            raise ValueError(f"LossySSD beta must be in (0, 1] (SSD uses 0.4; beta 0 is the lossless Chain), "
                             f"got {self.beta!r}")
        object.__setattr__(self, "beta", float(self.beta))

    def tree(self, n_codes: int) -> DraftTree:
        """The chain's tree: one path of ``window - 1`` nodes."""
        return _trees().chain(self.window - 1)

    @property
    def lossy_tolerance(self) -> float:
        """The ``beta`` that :func:`rvqspec_lib.decoding.verify.walk_tree` adds to the acceptance ratio."""
        return self.beta

    @property
    def nodes(self) -> int:
        """Query positions of one verify call: the window."""
        return self.window


def is_lossless(decoder) -> bool:
    """Whether a decoder preserves the target distribution (AR, Chain, Tree: yes; :class:`LossySSD`: no)."""
    return bool(getattr(decoder, "lossless", True))

