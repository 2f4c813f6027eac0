"""Utterance files: codes per utterance and the utterances shipped with the embedded model (``utterances.safetensors``
+ ``utterances.jsonl``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rvqspec_lib.common.files import atomic_output, json_text, write_text_atomic
from rvqspec_lib.data.teacher import Utterance
from rvqspec_lib.models import drafter_files, loader


def embedded_root(model: str | os.PathLike = "embedded") -> Path:
    """The folder of a model's shipped (or spoken) ``utterances.safetensors``: ``data/embedded`` for ``"embedded"``,
    else the (loaded) model's folder of prepared files
    (:func:`~rvqspec_lib.models.drafter_files.model_drafter_dir`: a checkpoint's own folder or its cache folder) or
    its parent. Raises FileNotFoundError naming the command that writes them (``rvqspec prepare`` for a checkpoint,
    ``make embedded`` for our own models)."""
    name = getattr(model, "name", model)
    d = drafter_files.model_drafter_dir(model)
    if d is None:
        raise FileNotFoundError(f"{name} has no folder of its own, so no shipped utterances: use the embedded model, "
                                "a checkpoint folder or a hub id (prepared by `rvqspec prepare --model ...`)")
    p = loader.EMBEDDED_DIR if str(name) == loader.EMBEDDED_MODEL else d
    for f in (p, p.parent):
        if (f / "utterances.safetensors").is_file():
            return f
    if (p / "config.json").is_file() and not (p / loader.OWN_MODEL_MARKER).is_file():  # a checkpoint
        raise FileNotFoundError(f"no utterances.safetensors in {p}: the checkpoint's own spoken frames are made by "
                                f"`{drafter_files.prepare_command(name)}`")
    raise FileNotFoundError(f"no utterances.safetensors in {p} or {p.parent}: the embedded model's data is written by "
                            "`make embedded` (recipes/embedded/build.py --out DIR writes DIR/utterances.safetensors); "
                            f"a checkpoint's by `{drafter_files.prepare_command(name)}`")


SHIPPED_FIELDS = ("id", "split", "language", "voice", "text", "source", "seconds", "frames")


def write_shipped_utterances(rows: Iterable[Mapping], codes: Mapping[str, np.ndarray],
                             path: str | os.PathLike) -> Path:
    """Write ``path`` (safetensors ``{id: (frames, G) int16}``) and its ``.jsonl`` sibling (:data:`SHIPPED_FIELDS`);
    returns ``path``."""
    rows = [{k: r[k] for k in SHIPPED_FIELDS if k in r} for r in rows]
    p = Path(path)
    sub = {r["id"]: np.asarray(codes[r["id"]]).astype(np.int16) for r in rows}
    save_codes(sub, p)
    write_text_atomic(p.with_suffix(".jsonl"),
                      "".join(json_text(r, indent=None, ensure_ascii=False) + "\n" for r in rows))
    return p


def load_shipped_utterances(path: str | os.PathLike, *, splits: Sequence[str] | None = None,
                            limit: int | None = None) -> tuple[list[dict], list[Utterance]]:
    """Index-aligned ``(rows, utterances)`` of what :func:`write_shipped_utterances` wrote, of ``splits`` (``None``:
    all), at most ``limit``. Raises FileNotFoundError: a file missing; ValueError: no row of ``splits``, rows
    without codes."""
    p = Path(path)
    j = p.with_suffix(".jsonl")
    for f in (p, j):
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: the embedded model's shipped utterances are written by "
                                    "`make embedded` (recipes/embedded/build.py, stage 'ship')")
    rows = [json.loads(line) for line in j.read_text().splitlines() if line.strip()]
    if splits is not None:
        unknown = set(splits) - {r["split"] for r in rows}
        if unknown == set(splits):
            raise ValueError(f"no utterances of split(s) {sorted(unknown)} in {j}; it has "
                             f"{sorted({r['split'] for r in rows})}")
        rows = [r for r in rows if r["split"] in splits]
    if limit is not None:
        rows = rows[:limit]
    codes = load_codes(p)
    missing = [r["id"] for r in rows if r["id"] not in codes]
    if missing:
        raise ValueError(f"{p} lacks the codes of {len(missing)} row(s) of {j} (e.g. {missing[0]}): rebuild with "
                         "`make embedded`")
    return rows, utterances_from_manifest(rows, codes)


def save_codes(codes: Mapping[str, np.ndarray], path: str | os.PathLike) -> Path:
    """Write ``{id: codes}`` to one safetensors file, atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(p) as tmp:
        save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in codes.items()}, str(tmp),
                  metadata={"format": "rvqspec-codes"})
    return p


def load_codes(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a file written by :func:`save_codes`: ``{id: (frames, G) array}``."""
    return {k: v.numpy() for k, v in load_file(str(path)).items()}


def utterances_from_manifest(rows: Iterable[Mapping], codes: Mapping[str, np.ndarray], *,
                             splits: Sequence[str] | None = None) -> list[Utterance]:
    """One :class:`~rvqspec_lib.data.teacher.Utterance` per manifest row (``id, text, split, voice``) of ``splits``
    (``None``: all) with codes ``{id: (frames, G)}``, in order; the speaker the row's ``voice`` (lowercased), the
    prompt language ``auto``."""
    out = []
    for r in rows:
        if splits is not None and r.get("split") not in splits:
            continue
        c = codes.get(r["id"])
        if c is None or len(c) == 0:
            continue
        out.append(Utterance(r["text"], torch.as_tensor(np.asarray(c), dtype=torch.long), str(r["voice"]).lower(),
                             "auto"))
    return out

