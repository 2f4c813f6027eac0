"""Calibrated draft trees on disk, beside the model they were calibrated for, and loadable by name.

A calibration (:func:`rvqspec_lib.eval.calibration.calibrate`) is a small JSON file,
``<model_dir>/trees/<drafter>.json`` (the trees depend on the drafter that proposes the codes): for each kind
(``point-mass``, ``sampled``) the tree of every node budget N = 2..64 and its predicted tokens per call. Names
accepted wherever a tree is asked for (``rvqspec synth --tree calibrated:16``):

* ``calibrated:N`` -- the kind with the larger predicted tokens per call at budget N;
* ``calibrated-sampled:N`` / ``calibrated-point-mass:N`` -- that kind.

N counts the root: it is the number of query positions of one verify call (docs/methods.md#the-tree-as-data).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rvqspec_lib.common.provenance import usual_mode
from rvqspec_lib.models.drafter_files import model_drafter_dir
from rvqspec_lib.spec.decoders import Tree

FORMAT = "rvqspec-trees"
_NAME = re.compile(r"^calibrated(?:-(sampled|point-mass))?:(\d+)$")


def is_calibrated_name(text: str) -> bool:
    """Whether ``text`` names a calibrated tree (``calibrated:16``, ``calibrated-sampled:32`` ...)."""
    return isinstance(text, str) and text.strip().startswith("calibrated")


def parse_tree_name(text: str) -> tuple[str | None, int]:
    """``"calibrated-sampled:16"`` -> ``("sampled", 16)``; ``"calibrated:16"`` -> ``(None, 16)`` (best kind).

    Raises:
        ValueError: anything else, or a budget outside 2..64 (one line naming the accepted forms).
    """
    m = _NAME.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"unknown tree name {text!r}: use calibrated:N, calibrated-sampled:N or "
                         "calibrated-point-mass:N with N in 2..64, or rank paths like '0;1;0,0'")
    n = int(m.group(2))
    if not 2 <= n <= 64:
        raise ValueError(f"node budget {n} is outside 2..64 (the root plus 1..63 drafts): e.g. calibrated:16")
    return m.group(1), n


def tree_file(model: str | os.PathLike, drafter: str = "heads") -> Path | None:
    """``<model_dir>/trees/<drafter>.json`` for a model folder or ``"embedded"``; ``None`` for models without a
    folder of their own (``tiny-random``, random-size names, hub ids)."""
    d = model_drafter_dir(model)
    return None if d is None else d / "trees" / f"{drafter}.json"


def save_calibration(calibration: dict, path: str | os.PathLike) -> Path:
    """Write a calibration as JSON, atomically (a temporary file renamed into place), with the usual file mode."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(calibration, indent=1, allow_nan=False))
    usual_mode(tmp)
    os.replace(tmp, p)
    return p


def load_calibration(path: str | os.PathLike, *, n_codes: int | None = None,
                     codebook_size: int | None = None) -> dict:
    """Read a calibration file and check it fits the model.

    Raises:
        FileNotFoundError: no file (the message says how to make one).
        ValueError: not a calibration file, or one made for another number of codes or codebook size.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no calibrated trees at {p}: calibrate first (notebook 03, or "
                                "rvqspec_lib.eval.calibration.calibrate + rvqspec_lib.models.tree_files.save_calibration)")
    try:
        cal = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p} is not a calibration file ({e.__class__.__name__}): recalibrate") from None
    if not isinstance(cal, dict) or cal.get("format") != FORMAT:
        raise ValueError(f"{p} is not an rvqspec calibration file (format {FORMAT!r}): recalibrate")
    for key, want in (("n_codes", n_codes), ("codebook_size", codebook_size)):
        if want is not None and int(cal.get(key, -1)) != int(want):
            raise ValueError(f"{p} was calibrated for {key} = {cal.get(key)}, this model has {want}: calibrate the "
                             "trees for this model")
    return cal


def tree_from_calibration(calibration: dict, kind: str | None, budget: int) -> Tree:
    """The calibrated :class:`~rvqspec_lib.spec.decoders.Tree` of ``budget`` nodes (``kind`` ``None``: the better).

    Raises:
        ValueError: a budget or kind the calibration does not hold.
    """
    kinds = ("point-mass", "sampled")
    if kind is None:
        kind = calibration.get("best_kind", {}).get(str(budget))
    budgets = [int(b) for b in calibration.get("budgets", [])]
    if kind not in kinds or budget not in budgets:
        raise ValueError(f"no calibrated tree of node budget {budget} (kind {kind}): this calibration holds N in "
                         f"{min(budgets) if budgets else '-'}..{max(budgets) if budgets else '-'}")
    order = calibration[kind]["order"]
    return Tree([tuple(x) for x in order[: budget - 1]], sampled=kind == "sampled")


def load_named_tree(name: str, model: str | os.PathLike, code_predictor, *, drafter: str = "heads",
                    path: str | os.PathLike | None = None) -> Tree:
    """Resolve ``calibrated[-kind]:N`` for a model: its ``trees/<drafter>.json`` (or ``path``), checked against the
    code predictor's number of codes and codebook size.

    Raises:
        ValueError: a bad name, a model with no folder for trees and no ``path``, a file for another model.
        FileNotFoundError: the model has no calibration for this drafter.
    """
    kind, budget = parse_tree_name(name)
    p = Path(path) if path is not None else tree_file(model, drafter)
    if p is None:
        raise ValueError(f"{model} has no folder to hold calibrated trees: calibrate and pass the file's path")
    cal = load_calibration(p, n_codes=int(code_predictor.config.num_code_groups) - 1,
                           codebook_size=int(code_predictor.config.vocab_size))
    return tree_from_calibration(cal, kind, budget)
