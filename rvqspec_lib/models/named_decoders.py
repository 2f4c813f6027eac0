"""THE resolver from a decoder name (:mod:`rvqspec_lib.decoding.decoder_names`) to a decoder with its drafter and
tree, reading the drafters (``drafters/``) and calibrations (``trees/``) shipped beside a loaded model: every command,
table and notebook builds its decoders here. :func:`check_files` is the same lookup before the model loads, so a
command fails in one line before loading (docs/architecture.md#the-four-ones).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from rvqspec_lib.decoding.decoder_names import PAPER_DRAFTER, DecoderName, parse_decoder_name
from rvqspec_lib.models.drafter_files import check_shipped_drafter, prepare_command, shipped_drafter, shipped_drafters
from rvqspec_lib.models.tree_files import load_calibration, tree_file


@dataclass(frozen=True)
class NamedDecoder:
    """A decoder resolved from its name: ``name`` (the final :class:`~rvqspec_lib.decoding.decoder_names.DecoderName`,
    whose ``label`` and ``fields()`` it answers for), ``decoder``, ``drafter`` (``None``: the reused heads),
    ``calibration`` (``None`` when none was read) and ``note`` (what resolving decided that the name did not say)."""

    name: DecoderName
    decoder: object
    drafter: object = field(default=None, repr=False)
    calibration: dict | None = field(default=None, repr=False)
    note: str | None = None

    def __getattr__(self, attr: str):
        """What the name says, ``label`` and ``fields()`` among it, is the :class:`DecoderName`'s (THE label)."""
        if attr.startswith("_") or attr == "name":
            raise AttributeError(attr)
        return getattr(self.name, attr)


def drafter_calibration(lm, drafter: str = "heads") -> dict | None:
    """The calibration shipped beside a loaded model for ``drafter`` (``<model>/trees/<drafter>.json``), checked
    against the model's number of codes and codebook size; ``None`` when the model has no folder or no such file.

    Raises:
        ValueError: a damaged file or one made for another model (one line naming the command that remakes it).
    """
    path = tree_file(lm, drafter)
    return load_calibration(path, n_codes=lm.n_code_groups - 1, codebook_size=lm.codebook_size, model=lm.name,
                            drafter=drafter) if path is not None and path.is_file() else None


def has_paper_decoder(lm) -> bool:
    """Whether a loaded model ships what ``paper`` needs: the offsets drafter and its calibration file."""
    path = tree_file(lm, PAPER_DRAFTER)
    return path is not None and path.is_file() and PAPER_DRAFTER in shipped_drafters(lm)


def _given_or_read(given: Mapping | None, d: DecoderName, lm, what: str, keyword: str, read):
    """``given[d.drafter]``, else ``read()`` from beside ``lm`` (ValueError when there is no model to read)."""
    got = (given or {}).get(d.drafter)
    if got is None:
        if lm is None:
            raise ValueError(f"decoder {d.text!r} reads the {d.drafter} {what}: give the loaded model, or pass it as "
                             f"{keyword}={{{d.drafter!r}: ...}}")
        got = read()
    return got


def _calibration_path(model, d: DecoderName, missing=FileNotFoundError):
    """The calibration file a calibrated name reads beside ``model``; raises ``missing`` (one line naming the fix)
    when there is none, ValueError when the model has no folder to hold one."""
    path = tree_file(model, d.drafter)
    if path is None:
        raise ValueError(f"decoder {d.text!r} needs the {d.drafter} drafter's calibrated trees, and "
                         f"{getattr(model, 'name', model)} has no folder to hold them (random weights built in "
                         "memory): give rank paths (tree:0;1;0,0), or use a checkpoint folder, a hub id or the "
                         "embedded model")
    if not path.is_file():
        raise missing(f"decoder {d.text!r}: no calibrated trees at {path}: calibrate them with "
                      f"`{prepare_command(model)}`, or give rank paths (tree:0;1;0,0)")
    return path


def _capped(d: DecoderName, budget: int, model, path=None) -> str | None:
    """The note of a ``paper`` without ``:N`` whose calibration holds fewer than 32 nodes (``None``: not capped)."""
    where = "" if path is None else f" ({path})"
    return None if budget >= d.budget else (
        f"{d.text}: the {d.drafter} calibration{where} holds budgets up to {budget}; using N {budget} (recalibrate: "
        f"{prepare_command(getattr(model, 'name', model))})")


def resolve(name: str | DecoderName, lm, *, calibrations: Mapping[str, dict] | None = None,
            drafters: Mapping[str, object] | None = None, best_chain: int | None = None) -> NamedDecoder:
    """The decoder a name stands for, on a loaded model (module docstring).

    Args:
        name: a decoder name of the grammar (``ar``, ``chain:4``, ``paper[:N]`` ...) or a parsed
            :class:`DecoderName`. lm: the loaded model, or ``None`` when the two mappings hold what the name reads.
        calibrations, drafters: ``{drafter: calibration dict}``, ``{drafter: module}`` to use instead of the shipped
            files (made in a run). best_chain: the window of ``chain:best``.

    Raises:
        ValueError: a bad name; ``auto`` (chosen by timing: :func:`rvqspec_lib.eval.budget.auto_decoder`); a drafter
            not shipped, a missing calibration or budget; ``lm`` None and a file to read (one line each, naming the
            fix).
    """
    d = parse_decoder_name(name) if isinstance(name, str) else name
    drafter = cal = None
    if d.drafter != "heads":  # ar's drafter is always the heads
        drafter = _given_or_read(drafters, d, lm, "drafter", "drafters",
                                 lambda: shipped_drafter(lm, d.drafter, lm.code_predictor))
    if "calibration" in d.needs:
        cal = _given_or_read(calibrations, d, lm, "calibration", "calibrations",
                             lambda: drafter_calibration(lm, d.drafter) or _calibration_path(lm, d, ValueError))
    try:
        dec = d.decoder(calibration=cal, best_chain=best_chain, drafter=drafter)
    except ValueError as e:
        raise ValueError(str(e) if d.text in str(e) or "decoder" in str(e) else f"decoder {d.text!r}: {e}") from None
    final = d.resolved(dec)
    note = _capped(d, final.budget, lm if lm is not None else "<model>") if d.kind == "paper" else None
    return NamedDecoder(final, dec, drafter, cal, note)


def resolve_all(names: Sequence[str], lm, **kw) -> dict[str, NamedDecoder]:
    """``{label: NamedDecoder}`` for several names (:func:`resolve`'s keywords), each file read once.

    Raises:
        ValueError: the first bad name; two names that resolve to the same decoder label.
    """
    cals, drafters = dict(kw.pop("calibrations", None) or {}), dict(kw.pop("drafters", None) or {})
    out, texts = {}, {}
    for text in names:
        nd = resolve(text, lm, calibrations=cals, drafters=drafters, **kw)
        for read, got in ((cals, nd.calibration), (drafters, nd.drafter)):
            if got is not None:
                read.setdefault(nd.name.drafter, got)
        if nd.label in out:
            raise ValueError(f"decoders {texts[nd.label]!r} and {text!r} are the same decoder ({nd.label}): name it "
                             "once")
        out[nd.label], texts[nd.label] = nd, text
    return out


def check_files(name: str | DecoderName, model: str | os.PathLike, *, n_codes: int | None = None,
                codebook_size: int | None = None) -> str | None:
    """Before loading: the drafter and calibration files a decoder name reads beside the model exist and are sound
    (checked against the model's sizes when given). Returns a one-line note when the tree used has fewer nodes than
    the name asks for, else ``None``.

    Raises:
        ValueError, FileNotFoundError: one line naming the file and the fix (the recalibrate command).
    """
    d = parse_decoder_name(name) if isinstance(name, str) else name
    # a Path as text: drafter_files would take a Path's .name for the model's name, and look in the wrong folder
    model = os.fspath(model) if isinstance(model, os.PathLike) else model
    # paper always drafts with the offsets: the heads' form is a tree of its own
    heads_trees = tree_file(model, "heads") if d.kind == "paper" else None  # offered only where they exist
    check_shipped_drafter(model, d.drafter, heads_instead=None if d.kind != "paper" else (
        f"tree:calibrated-point-mass:{d.budget}@heads (the reused heads with their own tree, no training)"
        if heads_trees is not None and heads_trees.is_file() else
        "chain:4 (the reused heads as a chain: no training, no calibration)"))
    if "calibration" not in d.needs:
        return None
    path = _calibration_path(model, d)
    cal = load_calibration(path, n_codes=n_codes, codebook_size=codebook_size, model=model, drafter=d.drafter)
    if d.kind == "auto":
        return None
    try:
        return _capped(d, d.calibrated_tree(cal).nodes, model, path)
    except ValueError as e:
        raise ValueError(f"--decoder {d.text}: {e} ({path})") from None
