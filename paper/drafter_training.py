"""Table 2's training plan (notebook 03; paper §2.2): five drafters and losses (:data:`TABLE2_DRAFTERS`), each at
the learning rate its exact validation acceptance picks (:func:`train_drafters`), the offsets deployed beside
the model chosen the same way (:func:`select_deployed`, :func:`deploy_drafters`), the parameters each adds to a
released model (:func:`params_added_for_config`). One drafter is trained by the
library's :func:`rvqspec_lib.training.drafters.train_drafter` (``rvqspec train-drafter``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rvqspec_lib.data.frames import Frames
from rvqspec_lib.decoding.drafters import DEFAULT_K, DRAFTERS, MedusaHeads, PositionOffsets
from rvqspec_lib.models.drafter_files import drafter_path, make_drafter, save_drafter
from rvqspec_lib.training.drafters import DEFAULT_LR, LOSSES, train_drafter


def validation_acceptance(drafter) -> float:
    """Mean over offsets of the exact validation acceptance at the kept epoch (``provenance``); every choice below
    is made on it. Raises ValueError: a drafter not trained by :func:`train_drafter`."""
    acc = (getattr(drafter, "provenance", None) or {}).get("val_acceptance_by_offset")
    if not acc:
        raise ValueError(f"{getattr(drafter, 'name', drafter)!r} has no validation acceptance in its provenance: "
                         "train it with rvqspec_lib.training.drafters.train_drafter")
    return float(np.mean(acc))


def select_deployed(drafters: dict, kind: str = "offsets") -> str:
    """The label of the ``kind`` drafter of ``{label: drafter}`` of highest :func:`validation_acceptance` (ties: the
    first). Raises ValueError: none of that kind, or one without validation provenance."""
    labels = [lab for lab, d in drafters.items() if getattr(d, "name", None) == kind]
    if not labels:
        raise ValueError(f"no {kind!r} drafter among {list(drafters)}: train one first")
    scores = {lab: validation_acceptance(drafters[lab]) for lab in labels}
    return max(labels, key=lambda lab: scores[lab])  # max keeps the first of equal scores


#: The drafters Table 2 trains, ``label: (drafter, loss)``: the paper's two (cross-entropy) and three other losses.
TABLE2_DRAFTERS = {"offsets-ce": ("offsets", "ce"), "offsets-kl": ("offsets", "kl"), "offsets-tv": ("offsets", "tv"),
                   "medusa": ("medusa", "ce"), "medusa-tv": ("medusa", "tv")}


@dataclass
class TrainedDrafters:
    """What :func:`train_drafters` returns: ``{label: drafter}`` and ``{label: TrainResult}`` at the chosen rates,
    and every rate tried, a row each (``drafter, lr, best_epoch, val_acceptance_mean, val_acceptance_init,
    chosen``)."""

    drafters: dict
    results: dict
    lr_rows: list[dict]

    def curve_rows(self) -> list[dict]:
        """One row per (drafter, epoch): ``drafter, epoch, train_loss, val_loss, val_acceptance_t1.., wall_s``."""
        return [{"drafter": label, "epoch": c["epoch"], "train_loss": c["train_loss"], "val_loss": c["val_loss"],
                 **{f"val_acceptance_t{j + 1}": a for j, a in enumerate(c["val_acceptance_by_offset"])},
                 "wall_s": c["elapsed_s"]} for label, res in self.results.items() for c in res.curve]


def train_drafters(code_predictor, plan, train: Frames, val: Frames, *, K: int, lrs: dict | None = None,
                   progress: bool = False, **train_kwargs) -> TrainedDrafters:
    """Train each ``{label: (drafter name, loss)}`` of ``plan`` (e.g. :data:`TABLE2_DRAFTERS`) from a fresh drafter
    at each rate of ``lrs[label]`` (default ``[None]``: :data:`DEFAULT_LR`'s) with :func:`train_drafter` and keep the
    highest :func:`validation_acceptance` (ties: the earlier rate), chosen on ``val``, never on evaluation;
    ``train_kwargs`` go to :func:`train_drafter`.

    Raises:
        ValueError: before any training: an empty plan, an unknown drafter or loss, a rate that is not positive, no
            validation frames, ``lr`` among ``train_kwargs``.
    """
    plan = dict(plan)
    if not plan:
        raise ValueError("nothing to train: give {label: (drafter, loss)}, e.g. TABLE2_DRAFTERS")
    bad = {lab: spec for lab, spec in plan.items() if spec[0] not in DEFAULT_LR or spec[1] not in LOSSES}
    if bad:
        raise ValueError(f"{bad}: drafters are one of {list(DEFAULT_LR)}, losses one of {LOSSES}")
    lrs = {label: list((lrs or {}).get(label) or [None]) for label in plan}
    bad = [lr for rates in lrs.values() for lr in rates if lr is not None and not lr > 0]
    if bad:
        raise ValueError(f"learning rates must be > 0 (or None for the default), got {bad}")
    if val is None or len(val) == 0:
        raise ValueError("the learning rate is chosen on validation frames: pass val (e.g. the shipped validation "
                         "split)")
    if "lr" in train_kwargs:
        raise ValueError("pass the rates as lrs={label: [...]}, not lr=")
    drafters, results, rows = {}, {}, []
    for label, (name, loss) in plan.items():
        tried, best, best_score = [], None, None
        for lr in lrs[label]:
            res = train_drafter(make_drafter(name, code_predictor, fresh=True, K=K), code_predictor, train, val,
                                lr=lr, loss=loss, progress=progress, **train_kwargs)
            score = validation_acceptance(res.drafter)
            tried.append({"drafter": label, "lr": res.drafter.provenance["lr"], "best_epoch": res.best_epoch,
                          "val_acceptance_mean": score,
                          "val_acceptance_init": float(np.mean(res.curve[0]["val_acceptance_by_offset"]))})
            if best_score is None or score > best_score:
                best, best_score = (len(tried) - 1, res), score
        for i, row in enumerate(tried):
            row["chosen"] = i == best[0]
        rows += tried
        drafters[label], results[label] = best[1].drafter, best[1]
    return TrainedDrafters(drafters, results, rows)


def deploy_drafters(drafters: dict, deployed: str, model_dir: str | os.PathLike, kind: str = "offsets") -> dict:
    """Write ``drafters[deployed]`` as ``<model_dir>/drafters/<kind>.safetensors`` (what ``--drafter offsets`` loads)
    and every ``kind`` drafter under its label. Returns ``{"deployed_<kind>": path, "model_<label>": path, ...}``.
    Raises ValueError: ``deployed`` is not a ``kind`` drafter of ``drafters``."""
    if deployed not in drafters or getattr(drafters[deployed], "name", None) != kind:
        raise ValueError(f"{deployed!r} is not a {kind!r} drafter among {list(drafters)}: pick one with "
                         "select_deployed")
    files = {f"deployed_{kind}": save_drafter(drafters[deployed], drafter_path(model_dir, kind))}
    for lab, d in drafters.items():
        if getattr(d, "name", None) == kind:
            files[f"model_{lab}"] = save_drafter(d, Path(model_dir) / "drafters" / f"{lab}.safetensors")
    return files


def params_added_for_config(name: str, config: dict | str | os.PathLike, *, K: int = DEFAULT_K) -> int:
    """Exact parameters a drafter adds to the code predictor of a released ``config.json`` (a dict or a path), counted
    on the ``meta`` device. Raises ValueError: an unknown drafter."""
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}: choose one of {', '.join(DRAFTERS)}")
    if not isinstance(config, dict):
        config = json.loads(Path(config).read_text())
    cp = config["talker_config"]["code_predictor_config"]
    if name == "heads":
        return 0
    with torch.device("meta"):
        if name == "offsets":
            return PositionOffsets(K, int(cp["hidden_size"])).params_added
        return MedusaHeads(K, int(cp["num_code_groups"]) - 1, int(cp["hidden_size"]), int(cp["vocab_size"]),
                           False).params_added
