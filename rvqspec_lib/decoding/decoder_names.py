"""The ONE grammar of decoder names (docs/cli.md#decoder-names, :data:`GRAMMAR`), used by every command and
evaluation. :func:`parse_decoder_name` gives a :class:`DecoderName`; :meth:`DecoderName.decoder` builds the decoder
once the calibration and the drafter are at hand. Pure: no files, no torch at import; errors are one-line ValueErrors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Sequence

from rvqspec_lib.decoding.decoders import AR, DEFAULT_TREE, DEFAULT_WINDOW, Chain, LossySSD, Tree

#: Node budget of a calibrated tree named without ``:N`` (the paper's devices peak at N = 16 or 32).
DEFAULT_TREE_BUDGET = 16
#: Node budget of ``paper`` without ``:N``: the paper's (N = 32).
PAPER_BUDGET = 32
#: The drafter of the paper's decoder (a file ``<model>/drafters/offsets.safetensors``) and of names without ``@``.
PAPER_DRAFTER = "offsets"
DEFAULT_DRAFTER = "heads"
#: Node budgets a calibration holds (the root plus 1..63 drafts).
MIN_BUDGET, MAX_BUDGET = 2, 64
#: Tree kinds of a calibration file.
TREE_KINDS = ("point-mass", "sampled")
#: Every accepted form, in order: (form, how the grammar line writes it).
FORMS = (("ar", "ar"), ("chain", "chain[:N] (N in 2..8)"), ("chain:best", "chain:best"),
         ("tree", "tree[:<rank paths e.g. 0;1;0,0>]"), ("tree-sampled", "tree-sampled:<paths>"),
         ("calibrated", "tree:calibrated[-point-mass|-sampled][:N] (N in 2..64)"),
         ("ssd-lossy", "ssd-lossy[:BETA] (LOSSY control)"), ("auto", "auto"),
         ("paper", "paper[:N] (offsets + their calibrated point-mass tree, N default 32)"))


def grammar(without: Sequence[str] = ()) -> str:
    """One line listing the accepted forms less ``without`` (e.g. ``("chain:best",)``), for messages and help."""
    return (", ".join(text for form, text in FORMS if form not in without)
            + "; add @DRAFTER for another drafter (e.g. tree:calibrated:16@offsets)")


#: One line listing every accepted form (error messages and help texts).
GRAMMAR = grammar()

_DRAFTER = re.compile(r"^[a-z][a-z0-9_-]*$")
_CALIBRATED = re.compile(r"^calibrated(?:-([a-z-]+))?(?::(.*))?$")
_TREES = ("calibrated", "paper")  # the kinds whose tree comes from a calibration


@dataclass(frozen=True)
class DecoderName:
    """A parsed decoder name: ``kind`` one of ``ar chain tree calibrated ssd-lossy auto paper``, ``drafter`` a file
    name (``heads``: nothing to load), ``tree_kind`` ``None`` for the better one, ``budget`` N (root included),
    ``budget_given``: ``:N`` written, ``window`` of chain / ssd-lossy, ``best_window``: ``chain:best``, ``beta``:
    ssd-lossy's tolerance."""

    text: str
    kind: str
    drafter: str = DEFAULT_DRAFTER
    window: int | None = None
    best_window: bool = False
    paths: tuple | None = None
    sampled: bool = False
    tree_kind: str | None = None
    budget: int | None = None
    budget_given: bool = True
    beta: float | None = None

    @property
    def needs(self) -> set[str]:
        """What building it needs besides the model: ``"calibration"`` and/or ``"best_chain"``."""
        if self.kind in (*_TREES, "auto"):
            return {"calibration"}
        return {"best_chain"} if self.best_window else set()

    @property
    def label(self) -> str:
        """THE label of a decoder in tables, figures and rows: the canonical name (``chain:4``, ``paper:32``,
        ``...@offsets``), final once :meth:`resolved`; never parsed back (rows carry :meth:`fields`)."""
        k = self.kind
        if k in ("ar", "paper"):  # neither takes @DRAFTER
            return "ar" if k == "ar" else f"paper:{self.budget}"
        base = ("auto" if k == "auto" else f"ssd-lossy:{self.beta:g}" if k == "ssd-lossy" else
                ("chain:best" if self.best_window else f"chain:{self.window}") if k == "chain" else
                f"tree{'-sampled' * self.sampled}:{format_paths(self.paths)}" if k == "tree" else
                f"tree:calibrated{'-' + self.tree_kind if self.tree_kind else ''}:{self.budget}")
        return base if self.drafter == DEFAULT_DRAFTER else f"{base}@{self.drafter}"

    def resolved(self, decoder) -> "DecoderName":
        """This name with what building ``decoder`` decided filled in (a window, a tree's kind and budget)."""
        if self.kind == "chain" and self.best_window:
            return replace(self, best_window=False, window=int(decoder.window))
        if self.kind in _TREES:
            return replace(self, tree_kind="sampled" if decoder.sampled else "point-mass", sampled=decoder.sampled,
                           budget=decoder.nodes, budget_given=True)
        return self

    def fields(self) -> dict:
        """A result row's keys: ``decoder`` (:attr:`label`), ``kind``, ``drafter``, ``nodes``, ``lossy``, ``sampled``
        (``None`` where not known yet)."""
        nodes = {"ar": 1, "chain": self.window, "ssd-lossy": self.window, "calibrated": self.budget,
                 "paper": self.budget, "tree": None if self.paths is None else len(self.paths) + 1}.get(self.kind)
        return {"decoder": self.label, "kind": self.kind, "drafter": None if self.kind == "ar" else self.drafter,
                "nodes": nodes, "lossy": self.kind == "ssd-lossy",
                "sampled": None if self.kind == "calibrated" and not self.tree_kind else
                self.sampled or self.tree_kind == "sampled" or self.kind in ("chain", "ssd-lossy")}

    def decoder(self, *, calibration: dict | None = None, best_chain: int | None = None, drafter=None):
        """The decoder object, given THIS name's drafter's ``calibration`` dict, ``chain:best``'s window and the
        ``drafter`` module (``paper`` and ``@DRAFTER`` names). Raises ValueError: ``auto`` (chosen by timing), a
        missing calibration, window or drafter, a budget the calibration does not hold."""
        if self.kind == "ar":
            return AR()
        if self.kind == "auto":
            raise ValueError("auto is chosen by timing this device (rvqspec_lib.eval.budget.auto_decoder), not built")
        if self.drafter != DEFAULT_DRAFTER and drafter is None:
            raise ValueError(f"{self.text} drafts with the {self.drafter!r} drafter: load it first "
                             "(rvqspec_lib.models.drafter_files.shipped_drafter)")
        if self.kind == "chain":
            if self.best_window and best_chain is None:
                raise ValueError("chain:best needs calibration frames to choose the window: give chain:N")
            return Chain(int(best_chain) if self.best_window else self.window, drafter=drafter)
        if self.kind == "tree":
            return Tree(self.paths, sampled=self.sampled, drafter=drafter)
        if self.kind == "ssd-lossy":
            return LossySSD(window=self.window, beta=self.beta, drafter=drafter)
        return replace(self.calibrated_tree(calibration), drafter=drafter)

    def calibrated_tree(self, calibration: dict | None):
        """The calibrated ``Tree`` of a ``calibrated`` or ``paper`` name, without drafter (``paper`` without ``:N``:
        the largest budget up to 32). Raises ValueError: no calibration, a budget it does not hold."""
        if calibration is None:
            raise ValueError(f"{self.text} needs a calibration of this model's trees for the {self.drafter} drafter "
                             f"(<model>/trees/{self.drafter}.json): none was found")
        budget = self.budget
        if not self.budget_given:  # paper without :N: the paper's 32, capped to what is calibrated
            budget = max([int(b) for b in calibration.get("budgets", []) if int(b) <= budget], default=budget)
        return tree_from_calibration(calibration, self.tree_kind, budget)


def format_paths(paths: Sequence[Sequence[int]]) -> str:
    """``((0,), (1,), (0, 0))`` -> ``"0;1;0,0"``, the inverse of :func:`rvqspec_lib.decoding.trees.parse_paths`."""
    return ";".join(",".join(str(int(r)) for r in p) for p in paths)


def _budget(text: str, what: str) -> int:
    fix = f"e.g. {what.split(':')[0]}:16"
    if not text.isdigit():
        raise ValueError(f"node budget {text!r} of {what} is not a whole number: give N in {MIN_BUDGET}..{MAX_BUDGET}"
                         f", {fix}")
    if not MIN_BUDGET <= int(text) <= MAX_BUDGET:
        raise ValueError(f"node budget {int(text)} is outside {MIN_BUDGET}..{MAX_BUDGET} (the root plus 1..63 drafts): "
                         + fix)
    return int(text)


def parse_decoder_name(text: str, *, without: Sequence[str] = ()) -> DecoderName:
    """Parse one decoder name (:data:`GRAMMAR`); ``without``: forms the command does not take (:func:`grammar`).

    Raises:
        ValueError: one line naming the fix: an unknown name (the grammar is listed), a window outside 2..8, a
            node budget outside 2..64, a bad beta, malformed rank paths, a bad drafter qualifier.
    """
    from rvqspec_lib.decoding.trees import parse_paths  # local: trees imports torch, and this module must not

    raw = text.strip() if isinstance(text, str) else ""
    if not raw:
        raise ValueError(f"empty decoder name: use one of {grammar(without)}")
    body, at, drafter = (s.strip() for s in raw.partition("@"))
    if at and not _DRAFTER.match(drafter):
        raise ValueError(f"decoder {raw!r}: drafter {drafter!r} after '@' must be a drafter's file name beside the "
                         "model (e.g. @offsets for drafters/offsets.safetensors)")
    drafter = drafter or DEFAULT_DRAFTER
    head, colon, arg = (s.strip() for s in body.partition(":"))

    def name(kind: str, **kw) -> DecoderName:
        return DecoderName(raw, kind, drafter, **kw)

    try:
        if head in ("ar", "auto") and not colon:
            if head == "ar" and at:
                raise ValueError("ar drafts nothing: drop the @DRAFTER")
            return DecoderName(raw, "ar") if head == "ar" else name("auto")
        if head == "paper":
            if at:
                raise ValueError(f"paper always drafts with the {PAPER_DRAFTER} drafter: drop the @DRAFTER, or name "
                                 f"the tree, e.g. tree:calibrated-point-mass:32@{drafter}")
            return DecoderName(raw, "paper", PAPER_DRAFTER, tree_kind="point-mass", budget_given=bool(colon),
                               budget=_budget(arg, "paper:N") if colon else PAPER_BUDGET)
        if head == "chain":
            if arg == "best":
                return name("chain", best_window=True)
            return name("chain", window=Chain(int(arg) if arg.isdigit() else arg).window if colon else DEFAULT_WINDOW)
        if head == "calibrated" or head.startswith("calibrated-") or (head == "tree" and arg.startswith("calibrated")):
            tree = arg if head == "tree" else body
            m = _CALIBRATED.match(tree)
            if not m or m.group(1) not in (None, *TREE_KINDS):
                raise ValueError(f"unknown tree name {tree!r}: use calibrated:N, calibrated-sampled:N or "
                                 f"calibrated-point-mass:N with N in {MIN_BUDGET}..{MAX_BUDGET}, or rank paths like "
                                 "'0;1;0,0'")
            return name("calibrated", tree_kind=m.group(1), sampled=m.group(1) == "sampled",
                        budget=DEFAULT_TREE_BUDGET if m.group(2) is None else _budget(m.group(2), tree))
        if head in ("tree", "tree-sampled"):
            if head == "tree-sampled" and not arg:
                raise ValueError("tree-sampled needs rank paths, e.g. tree-sampled:0;0,0;1")
            return name("tree", paths=tuple(parse_paths(arg)) if arg else DEFAULT_TREE, sampled=head == "tree-sampled")
        if head == "ssd-lossy":
            try:
                beta = float(arg) if colon else 0.4
            except ValueError:
                raise ValueError(f"ssd-lossy beta {arg!r} is not a number: give one in (0, 1], e.g. ssd-lossy:0.4") \
                    from None
            if not 0 < beta <= 1:
                raise ValueError(f"ssd-lossy beta must be in (0, 1] (SSD uses 0.4; beta 0 is the lossless chain), "
                                 f"got {arg}")
            return name("ssd-lossy", window=4, beta=beta)
    except ValueError as e:
        raise ValueError(str(e) if repr(raw) in str(e) else f"decoder {raw!r}: {e}") from None
    raise ValueError(f"unknown decoder {raw!r}: use {grammar(without)}")


def split_decoder_list(text: str) -> list[str]:
    """``"ar,tree:0;1;0,0,chain"`` -> ``["ar", "tree:0;1;0,0", "chain"]`` (a piece starting with a digit continues
    the rank paths before it). Raises ValueError: an empty list."""
    parts: list[str] = []
    for piece in (text or "").split(","):
        piece = piece.strip()
        if parts and piece[:1].isdigit():
            parts[-1] += "," + piece
        elif piece:
            parts.append(piece)
    if not parts:
        raise ValueError(f"no decoder given: use a comma-separated list of {GRAMMAR}")
    return parts


def check_decoder_names(names: Sequence[str]) -> set[str]:
    """Parse every name BEFORE any work; returns their :attr:`DecoderName.needs` together (ValueError: a bad one)."""
    return set().union(*(parse_decoder_name(name).needs for name in names))


def calibration_budgets(names: Sequence[str]) -> list[int]:
    """Node budgets the calibrated names (``tree:calibrated...``, ``paper``) ask for, sorted."""
    return sorted({d.budget for d in map(parse_decoder_name, names) if d.kind in _TREES})


def name_of(decoder) -> DecoderName:
    """The name of a decoder object (``Chain(3)`` -> ``chain:3``), the inverse of :meth:`DecoderName.decoder` for
    names that read no file. Raises ValueError: not a decoder of :mod:`rvqspec_lib.decoding.decoders`."""
    drafter = getattr(getattr(decoder, "drafter", None), "name", None) or DEFAULT_DRAFTER
    t = type(decoder)
    if t not in (AR, Chain, Tree, LossySSD):
        raise ValueError(f"not a decoder: {decoder!r}")
    d = (DecoderName("", "ar") if t is AR else DecoderName("", "chain", drafter, window=decoder.window) if t is Chain
         else DecoderName("", "tree", drafter, paths=tuple(decoder.paths), sampled=decoder.sampled) if t is Tree
         else DecoderName("", "ssd-lossy", drafter, window=decoder.window, beta=decoder.beta))
    return replace(d, text=d.label)


def tree_from_calibration(calibration: dict, kind: str | None, budget: int):
    """The calibrated ``Tree`` of ``budget`` nodes (``kind`` ``None``: the better one): the first ``budget - 1`` of
    the kind's greedy ``order``. Raises ValueError: a budget or kind the calibration does not hold."""
    if kind is None:
        kind = (calibration.get("best_kind") or {}).get(str(budget))
    budgets = [int(b) for b in calibration.get("budgets", [])]
    if kind not in TREE_KINDS or budget not in budgets:
        raise ValueError(f"no calibrated tree of node budget {budget} (kind {kind}): this calibration holds N in "
                         f"{min(budgets, default='-')}..{max(budgets, default='-')}")
    return Tree([tuple(x) for x in calibration[kind]["order"][: budget - 1]], sampled=kind == "sampled")
