"""The inner-loop decoders as strategies: :class:`AR`, :class:`Chain` and :class:`Tree` (docs/methods.md), and
:class:`LossySSD`, a deliberately LOSSY control (SSD's tolerance rule) that WER-parity tests must catch.

A decoder says which draft tree one verify call checks (``tree(n_codes)``) and whether drafts are SAMPLED from q
(Chain; the ``min(1, p/q)`` rule) or the top-ranked codes of q (Tree with point-mass drafts; accept x with p(x)).
:func:`rvqspec_lib.decoding.decode.decode_frame` runs any of them. Shared constants live here, once: the chain windows
swept by evaluations (:data:`CHAIN_WINDOWS`, up to :data:`MAX_WINDOW`), the default window
(:data:`DEFAULT_WINDOW`) and the paper-style small default tree (:data:`DEFAULT_TREE`).

This module imports torch only when a tree is compiled (:func:`_trees`), so the command line can read these constants
for its help text without loading torch (``rvqspec --help`` starts in about 0.2 s; importing torch adds 1-2 s).
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
#: Window of ``Chain()`` and of ``--decoder chain`` without ``--window``.
DEFAULT_WINDOW = 4
#: Default sparse tree (``Tree()``'s and the command line's): top-2 one step ahead, the top code two and three steps
#: ahead below the first.
DEFAULT_TREE = ((0,), (1,), (0, 0), (0, 0, 0))


def _trees():
    """:class:`~rvqspec_lib.decoding.trees.DraftTree`, imported on first use: the one function-local import here,
    for the command line's start-up time (module docstring)."""
    from rvqspec_lib.decoding.trees import DraftTree

    return DraftTree


@dataclass(frozen=True)
class AR:
    """Autoregressive decoding: one code-predictor call per code (15 per frame), 1.00 token per call."""

    def tree(self, n_codes: int) -> DraftTree:
        """The empty tree: the root alone (a frame of ``n_codes`` codes)."""
        return _trees().from_paths([])

    sampled_drafts = False
    #: Query positions of one call (the node budget N).
    nodes = 1


@dataclass(frozen=True)
class Chain:
    """Chain speculation with sampled drafts (TensorRT-Edge-LLM ``--cpSpecVerifySize N``; seed 003).

    ``window`` N = the committed code plus N-1 drafts, each SAMPLED from the drafter's q for its depth; accepted with
    ``min(1, p/q)``, residual resample on the first rejection, bonus code when all are accepted: 1..N codes per call.

    ``drafter`` (keyword only): as :class:`Tree`'s.

    Raises:
        ValueError: window outside 2..:data:`MAX_WINDOW` (8).
    """

    window: int = DEFAULT_WINDOW
    drafter: object = field(default=None, repr=False, kw_only=True)

    def __post_init__(self):
        if not isinstance(self.window, int) or isinstance(self.window, bool) or not 2 <= self.window <= MAX_WINDOW:
            raise ValueError(f"Chain window must be an integer in 2..{MAX_WINDOW} (the committed code plus "
                             f"1..{MAX_WINDOW - 1} drafts), got {self.window!r}")

    def tree(self, n_codes: int) -> DraftTree:
        """One path of ``window - 1`` nodes (nodes past the frame's last depth are masked by the decode loop)."""
        return _trees().chain(self.window - 1)

    sampled_drafts = True

    @property
    def nodes(self) -> int:
        """Query positions of one verify call (the node budget N): the window."""
        return self.window


@dataclass(frozen=True)
class Tree:
    """Sparse-tree speculation: draft paths verified in ONE masked call (paper §2.2; docs/methods.md#sampled-trees).

    Two kinds of children (docs/methods.md#accept-and-reject-rules):

    * ``sampled=False`` (the paper's): point-mass drafts, the top-ranked codes of the drafter's q. A path
      ``(r1, .., rt)`` drafts the rank-``rt`` code at offset t below ``(r1, .., r(t-1))``. Accept child x with
      probability p(x), else zero it and try the next child.
    * ``sampled=True``: the children of a node are SAMPLED from q without replacement (Sequoia; Recursive
      Speculative Decoding). A path's entries are child indices: ``(0, 1)`` is the second child sampled below the
      first child of the root. Child i is drawn from q_i = q with the earlier siblings' codes removed and
      renormalised, accepted with ``min(1, p_i(x)/q_i(x))``; on rejection ``p_{i+1} = norm(max(p_i - q_i, 0))``.
      With one child per node this is exactly :class:`Chain`.

    Args:
        paths: rank (or child-index) paths, e.g. ``[(0,), (1,), (0, 0), (0, 0, 0)]`` (see :mod:`rvqspec_lib.decoding.trees`).
        sampled: sampled children instead of top-ranked ones.
        drafter: the drafter this tree drafts with (keyword only; ``None``: the caller's, by default the reused
            heads). A calibrated tree is calibrated FOR a drafter, so the paper's decoder carries its offsets here
            (:mod:`rvqspec_lib.decoding.decoder_names`); :func:`rvqspec_lib.decoding.decode.decode_frame` uses it.

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
        """The compiled tree, whatever ``n_codes`` (a tree deeper than the depths left is fine: nodes past the last
        depth are masked, the tree shrinks)."""
        return self._compiled

    @property
    def sampled_drafts(self) -> bool:
        """Whether drafts are sampled from q (True) or the top-ranked codes (False, point-mass)."""
        return self.sampled

    @property
    def nodes(self) -> int:
        """Query positions of one verify call (the node budget N): the root plus the tree's nodes."""
        return len(self.paths) + 1


@dataclass(frozen=True)
class LossySSD:
    """LOSSY control, NOT distribution-preserving: SSD's tolerance rule (Lin et al., Interspeech 2025, seed 004;
    docs/methods.md#ssd-tolerance-rule-a-lossy-control).

    A :class:`Chain` of ``window - 1`` drafts sampled from q whose drafts are accepted when
    ``u < min(1, p/q) + beta`` instead of ``u < min(1, p/q)``: any ``beta > 0`` keeps drafts more often than p
    allows, so the committed codes drift toward q. The residual and bonus draws are the chain's. It exists only as a
    negative control for WER parity and the code-distribution tests (:mod:`rvqspec_lib.eval.parity`), and its repr,
    label (``ssd-lossy:BETA``, :mod:`rvqspec_lib.decoding.decoder_names`) and every table that shows it say "lossy".

    Args:
        window: the committed code plus ``window - 1`` drafts (SSD's main setting: draft length 3, i.e. 4).
        beta: the tolerance (SSD's main setting 0.4), in (0, 1].

    Raises:
        ValueError: window outside 2..8, beta outside (0, 1].
    """

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
        """The tolerance ``beta`` that :func:`rvqspec_lib.decoding.verify.walk_tree` adds to the acceptance ratio."""
        return self.beta

    @property
    def nodes(self) -> int:
        """Query positions of one verify call: the window."""
        return self.window


def is_lossless(decoder) -> bool:
    """Whether a decoder preserves the target distribution (AR, Chain, Tree: yes; :class:`LossySSD`: no)."""
    return bool(getattr(decoder, "lossless", True))

