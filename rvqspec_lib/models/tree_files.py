"""Calibrated draft trees on disk, ``<model_dir>/trees/<drafter>.json`` (a tree ranks the codes its drafter proposes):
for each kind (``point-mass``, ``sampled``) the tree of every node budget N = 2..64 and its predicted tokens per call
(:func:`rvqspec_lib.eval.calibration.calibrate`), made by ``rvqspec prepare --model <model>``; decoder names are
resolved against them by ``rvqspec_lib.models.named_decoders``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rvqspec_lib.common.files import write_text_atomic
from rvqspec_lib.decoding.decoder_names import MAX_BUDGET, MIN_BUDGET, TREE_KINDS
from rvqspec_lib.models.drafter_files import model_drafter_dir, prepare_command

FORMAT = "rvqspec-trees"


def tree_file(model, drafter: str = "heads") -> Path | None:
    """``<model_dir>/trees/<drafter>.json`` for a model (:func:`~rvqspec_lib.models.drafter_files.model_drafter_dir`);
    ``None`` for a model without a folder."""
    d = model_drafter_dir(model)
    return None if d is None else d / "trees" / f"{drafter}.json"


def save_calibration(calibration: dict, path: str | os.PathLike) -> Path:
    """Write a calibration as JSON, atomically, the folder created. Returns the path.

    Raises:
        ValueError: a NaN or infinite number in ``calibration`` (JSON has none).
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(calibration, indent=1, allow_nan=False))


def _int(x, lo: int = 1, hi: float = float("inf")) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


def _problem(cal) -> str | None:
    """What is wrong with a calibration dict's shape (missing keys, wrong types, bad rank paths), or ``None``."""
    if not isinstance(cal, dict) or cal.get("format") != FORMAT:
        return f"not an rvqspec calibration file (format {FORMAT!r})"
    bad = next((k for k in ("n_codes", "codebook_size") if not _int(cal.get(k))), None)
    if bad:
        return f"{bad!r} is missing or not a positive integer"
    budgets, best = cal.get("budgets"), cal.get("best_kind")
    if not isinstance(budgets, list) or not budgets or not all(_int(b, MIN_BUDGET, MAX_BUDGET) for b in budgets):
        return f"'budgets' is missing or not a list of node budgets in {MIN_BUDGET}..{MAX_BUDGET}"
    if not isinstance(best, dict) or any(best.get(str(b)) not in TREE_KINDS for b in budgets):
        return "'best_kind' is missing or does not name point-mass or sampled for every budget"
    nodes = max(budgets) - 1  # calibrate grows exactly the largest budget's tree
    for kind in TREE_KINDS:
        k = cal.get(kind) if isinstance(cal.get(kind), dict) else {}
        order, pred, rows = k.get("order"), k.get("predicted_tokens_per_call"), k.get("by_start_depth")
        if not isinstance(order, list) or len(order) != nodes:
            return f"{kind}.order is missing or does not hold {nodes} nodes (the largest of 'budgets' less the root)"
        seen: set = set()
        for path in order:
            if not isinstance(path, list) or not path or not all(_int(r, 0, cal["codebook_size"] - 1) for r in path):
                return f"{kind}.order holds a bad rank path {path!r} (non-negative ranks inside the codebook)"
            if tuple(path) in seen or (len(path) > 1 and tuple(path[:-1]) not in seen):
                return f"{kind}.order holds the rank path {path!r} repeated or before its parent"
            seen.add(tuple(path))
        if not isinstance(pred, dict) or any(not isinstance(pred.get(str(b)), (int, float)) for b in budgets):
            return f"{kind}.predicted_tokens_per_call is missing or not a number for every budget"
        if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
            return f"{kind}.by_start_depth is missing or not a table"
    return None


def load_calibration(path: str | os.PathLike, *, n_codes: int | None = None, codebook_size: int | None = None,
                     model: str | os.PathLike | None = None, drafter: str | None = None) -> dict:
    """Read a calibration file, check its shape and that it fits the model; every error names the file and the
    command that remakes it (``model``, ``drafter``: default the file's folder and name).

    Raises:
        FileNotFoundError: no file.
        ValueError: not a well-formed calibration (:func:`_problem`), another drafter's, or one made for another
            number of codes or codebook size.
    """
    p = Path(path)
    cmd = prepare_command(model if model is not None else p.parent.parent)
    if not p.is_file():
        raise FileNotFoundError(f"no calibrated trees at {p}: calibrate first with `{cmd}`")
    try:
        cal = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p} is not a calibration file ({e.__class__.__name__}): recalibrate with `{cmd}`") from None
    except OSError as e:
        raise ValueError(f"{p} cannot be read ({e.strerror}): fix its permissions or recalibrate with `{cmd}`") \
            from None
    problem = _problem(cal)
    if problem:
        raise ValueError(f"{p} is damaged: {problem}: recalibrate with `{cmd}`")
    if drafter is not None and isinstance(cal.get("drafter"), str) and cal["drafter"] != drafter:
        raise ValueError(f"{p} is damaged: it was calibrated for the {cal['drafter']!r} drafter, not {drafter!r}: "
                         f"recalibrate with `{cmd}`")
    for key, want in (("n_codes", n_codes), ("codebook_size", codebook_size)):
        if want is not None and int(cal[key]) != int(want):
            raise ValueError(f"{p} was calibrated for {key} = {cal.get(key)}, this model has {want}: calibrate the "
                             f"trees for this model with `{cmd}`")
    return cal
