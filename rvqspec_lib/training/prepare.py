"""Preparing a model for the paper's decoder (``rvqspec prepare``; docs/cli.md#rvqspec-prepare): four stages, each
skipped when its output exists and is complete, so an interrupted run resumes where it stopped.

1. ``speak``: the model speaks the shipped calibration texts (``data/eval_texts/en_calibration.tsv``, the sentences
   the embedded model's calibration split is rendered from) with its own sampling, the speakers in turn, into
   ``utterances.safetensors`` (+ ``.jsonl``) in the three splits ``training``, ``validation`` and ``calibration``,
   different texts in each; saved after every batch, so a resumed run continues from the last batch.
2. ``offsets``: the position-aware offsets trained on the training split (validation split for early stopping):
   ``drafters/offsets.safetensors``.
3. ``trees``: the calibrated trees of every drafter a decoder name reads (the reused heads, the offsets, Medusa heads
   where shipped) on the calibration split: ``trees/<drafter>.json`` (redone when damaged, made for another model or older than its
   drafter).
4. ``auto``: ``--decoder auto`` timed on this device for each dtype asked (the choice cached per machine:
   :func:`rvqspec_lib.eval.budget.auto_for_model`).

Files go beside the model when its folder can be written, else (a hub cache, a read-only folder, a hub id) into the
project's cache folder (:func:`rvqspec_lib.models.drafter_files.model_drafter_dir`), where every command finds them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from rvqspec_lib.common.files import json_text, write_json_atomic, write_text_atomic
from rvqspec_lib.common.paths import DATA_DIR
from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.common.provenance import provenance
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.data.utterances import embedded_root, load_shipped_utterances, write_shipped_utterances
from rvqspec_lib.decoding.drafters import DEFAULT_K, DRAFTERS
from rvqspec_lib.eval import budget
from rvqspec_lib.eval.calibration import BUDGETS, calibrate, calibration_frames
from rvqspec_lib.models.drafter_files import (
    drafter_path,
    load_drafter,
    make_drafter,
    model_drafter_dir,
    save_drafter,
    shipped_drafter,
    shipped_drafters,
)
from rvqspec_lib.models.frame import inner_sampling, synthesize
from rvqspec_lib.models.loader import LoadedModel, auto_dtype
from rvqspec_lib.models.named_decoders import drafter_calibration
from rvqspec_lib.models.tree_files import load_calibration, save_calibration, tree_file
from rvqspec_lib.training.drafters import train_drafter

#: The texts the model speaks: the shipped calibration sentences (one a row, column ``text``).
TEXTS_FILE = DATA_DIR / "eval_texts" / "en_calibration.tsv"
#: Calibration frames by default (the shipped trees of the embedded model were calibrated on 1500).
DEFAULT_FRAMES = 1500
#: Frames of each split per calibration frame: the offsets train on as many frames as the trees calibrate on.
SPLIT_SHARES = {"training": 1.0, "validation": 0.2, "calibration": 1.0}
#: At most this many frames an utterance (16 s; a model that never ends, e.g. random weights, stops there).
MAX_FRAMES_PER_TEXT = 200
#: Texts spoken together in one batch of the frame loop.
SPEAK_BATCH = 4
#: Where the speak stage keeps what it has spoken so far (replaced by ``utterances.safetensors`` once complete).
PARTIAL = "utterances.partial.safetensors"
#: Monte Carlo draws of the sampled trees' calibration.
DRAWS = 2
STAGES = ("speak", "offsets", "trees", "auto")


def calibration_texts(path: str | os.PathLike = TEXTS_FILE) -> list[str]:
    """The sentences of a shipped text file (tab-separated, a ``text`` column), in file order.

    Raises:
        FileNotFoundError: no such file. ValueError: no ``text`` column or no sentence."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or "text" not in rows[0]:
        raise ValueError(f"{path} has no 'text' column: expected the shipped calibration texts")
    texts = [r["text"].strip() for r in rows if (r.get("text") or "").strip()]
    if not texts:
        raise ValueError(f"{path} holds no sentence")
    return texts


def split_targets(frames: int) -> dict[str, int]:
    """Frames wanted in each split for ``frames`` calibration frames (:data:`SPLIT_SHARES`, at least 1 each)."""
    if int(frames) < 1:
        raise ValueError(f"--frames must be >= 1 (calibration frames), got {frames}")
    return {s: max(1, int(round(share * frames))) for s, share in SPLIT_SHARES.items()}


@dataclass
class StageResult:
    """One stage of :func:`prepare`: ``stage``, ``skipped`` (its output was complete), ``seconds``, ``outputs``
    (paths), ``note`` (one line: what it made or why it skipped)."""

    stage: str
    skipped: bool
    seconds: float
    outputs: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Prepared:
    """What :func:`prepare` did: the folder written (``folder``), one :class:`StageResult` a stage, the device and
    dtype the model ran on, and whether ``auto``'s choice of every dtype is cached at the end (:func:`auto_cached`)."""

    folder: Path
    stages: list[StageResult]
    device: str
    dtype: str
    auto_cached: bool = False

    def to_json(self) -> dict:
        return {"folder": str(self.folder), "device": self.device, "dtype": self.dtype,
                "stages": [vars(s) for s in self.stages]}


# ---- 1. speak ---------------------------------------------------------------------------------------------------------
def _split_frames(rows: Sequence[dict]) -> dict[str, int]:
    have = {s: 0 for s in SPLIT_SHARES}
    for r in rows:
        have[r["split"]] = have.get(r["split"], 0) + int(r["frames"])
    return have


def _speak_complete(folder: Path, targets: dict[str, int], n_texts: int) -> bool:
    """The final utterance files hold every split's target frames (or every text was spoken)."""
    j = folder / "utterances.jsonl"
    if not (folder / "utterances.safetensors").is_file() or not j.is_file():
        return False
    try:
        rows = [json.loads(x) for x in j.read_text().splitlines() if x.strip()]
    except ValueError:
        return False
    have = _split_frames(rows)
    return all(have.get(s, 0) >= t for s, t in targets.items()) or \
        (len(rows) >= n_texts and all(have.get(s, 0) > 0 for s in targets))


def _next_split(have: dict[str, int], targets: dict[str, int]) -> str | None:
    """The split furthest from its target (in fraction of it), ``None`` once all are met; ties in split order."""
    need = {s: 1 - have.get(s, 0) / t for s, t in targets.items() if have.get(s, 0) < t}
    return max(need, key=need.get) if need else None


def _write_utterances(rows: list[dict], codes: dict, path: Path) -> None:
    """The codes and their manifest (``.jsonl`` beside), ``text_index`` kept: what a resumed run skips."""
    write_shipped_utterances(rows, codes, path)
    write_text_atomic(path.with_suffix(".jsonl"), "".join(json_text(r, indent=None, ensure_ascii=False) + "\n"
                                                          for r in rows))


def speak(lm: LoadedModel, folder: Path, targets: dict[str, int], *, seed: int = 0,
          max_frames_per_text: int = MAX_FRAMES_PER_TEXT, progress: bool = False) -> list[dict]:
    """Stage 1 (module docstring): speak the calibration texts (:data:`SPEAK_BATCH` a batch) until every split has its ``targets`` frames, resuming from
    :data:`PARTIAL`; each batch of texts goes to the split furthest from its target, each text at most
    ``max_frames_per_text`` frames and no more than the split still needs, the batch's generator seeded by ``seed``
    and its index (a resumed run speaks what an uninterrupted one would). Returns the rows written.

    Raises:
        ValueError: the model spoke no frame of any text (end of speech at once).
    """
    texts, batch_size = calibration_texts(), SPEAK_BATCH
    partial = folder / PARTIAL
    rows: list[dict] = []
    codes: dict[str, np.ndarray] = {}
    for src in (folder / "utterances.safetensors", partial):  # a larger --frames continues a finished stage
        if src.is_file() and src.with_suffix(".jsonl").is_file():
            rows, utts = load_shipped_utterances(src)
            codes = {r["id"]: u.codes.numpy() for r, u in zip(rows, utts)}
            rows = [r for r in rows if r["id"] in codes]
            break
    done = {r["text_index"] for r in rows if "text_index" in r}
    speakers = sorted(k for k in (lm.model.config.talker_config.spk_id or {}))
    have = _split_frames(rows)
    total = sum(targets.values())
    bar = progress_bar(range(total), total=total, desc="speaking calibration texts", enabled=progress,
                       unit="frame")
    if progress:
        bar.update(min(total, sum(min(have[s], t) for s, t in targets.items())))
    start = 0
    while start < len(texts):
        split = _next_split(have, targets)
        if split is None:
            break
        batch = [i for i in range(start, min(start + batch_size, len(texts))) if i not in done]
        b_index, start = start // batch_size, start + batch_size
        if not batch:
            continue
        speaker = speakers[b_index % len(speakers)] if speakers else None
        gen = torch.Generator(device=lm.device).manual_seed(seed * 1_000_003 + b_index)  # on the model's device
        need = targets[split] - have[split]  # the last batch of a split speaks no more than the split still needs
        cap = min(max_frames_per_text, -(-need // len(batch)))
        res = synthesize(lm, [texts[i] for i in batch], generator=gen, max_frames=cap, speaker=speaker)
        before = sum(min(have[s], t) for s, t in targets.items())
        for j, i in enumerate(batch):
            n = int(res.frames[j])
            if n == 0:
                continue
            rid = f"spoken-{i:05d}"
            codes[rid] = res.codes[j][:n].numpy()
            rows.append({"id": rid, "split": split, "language": "auto", "voice": speaker or "", "text": texts[i],
                         "source": "spoken by the model", "seconds": n / lm.frame_rate_hz, "frames": n,
                         "text_index": i})
            have[split] += n
        _write_utterances(rows, codes, partial)
        if progress:
            bar.update(sum(min(have[s], t) for s, t in targets.items()) - before)
    if progress:
        bar.close()
    if not rows:
        raise ValueError(f"{lm.name} spoke no frame of any calibration text (end of speech at once): check the model")
    _write_utterances(rows, codes, folder / "utterances.safetensors")
    partial.unlink(missing_ok=True)
    partial.with_suffix(".jsonl").unlink(missing_ok=True)
    return rows


# ---- 2. offsets -------------------------------------------------------------------------------------------------------
def _drafter_complete(lm: LoadedModel, path: Path) -> bool:
    try:
        load_drafter(path, lm.code_predictor)
        return True
    except (OSError, ValueError):
        return False


def train_offsets(lm: LoadedModel, folder: Path, targets: dict[str, int], *, seed: int = 0,
                  progress: bool = False) -> Path:
    """Stage 2: fresh offsets trained on the spoken training split (the validation split for early stopping);
    writes ``drafters/offsets.safetensors`` (+ ``.json`` and ``.curve.json``). Returns its path."""
    train = frames_from_shipped(lm, "training", max_frames=targets["training"], seed=seed, progress=progress)
    val = frames_from_shipped(lm, "validation", max_frames=targets["validation"], seed=seed, progress=progress)
    res = train_drafter(make_drafter("offsets", lm.code_predictor, fresh=True, K=DEFAULT_K), lm.code_predictor, train, val,
                        sampling=inner_sampling(lm), seed=seed, progress=progress)
    res.drafter.provenance.update(model=lm.name, frames={"training": len(train), "validation": len(val)},
                                  command="rvqspec prepare")
    out = drafter_path(folder, "offsets")
    save_drafter(res.drafter, out)
    write_json_atomic(out.with_suffix(".curve.json"), res.to_json())
    return out


# ---- 3. trees ---------------------------------------------------------------------------------------------------------
def _drafter_digest(folder: Path, drafter: str) -> str | None:
    """A digest of a drafter's file (``None`` for the heads, which have none): a tree calibrated for another
    version of the drafter is stale."""
    d = drafter_path(folder, drafter) if drafter != "heads" else None
    return hashlib.sha1(d.read_bytes()).hexdigest()[:16] if d is not None and d.is_file() else None


def _trees_complete(lm: LoadedModel, drafter: str, path: Path, frames: int) -> bool:
    """A sound calibration for this model and drafter, on at least ``frames`` frames, calibrated for the drafter's
    current file (where it recorded which: shipped calibrations that did not are trusted)."""
    try:
        cal = load_calibration(path, n_codes=lm.n_code_groups - 1, codebook_size=lm.codebook_size, model=lm.name,
                               drafter=drafter)
    except (OSError, ValueError):
        return False
    params = (cal.get("provenance") or {}).get("params", {})
    wanted, digest = params.get("n_calibration_frames"), params.get("drafter_sha1")
    stale = digest is not None and digest != _drafter_digest(path.parent.parent, drafter)
    return not stale and (wanted is None or int(wanted) >= frames)


def calibrate_trees(lm: LoadedModel, folder: Path, drafters: Sequence[str], frames: int, *, seed: int = 0,
                    progress: bool = False) -> list[Path]:
    """Stage 3: :func:`~rvqspec_lib.eval.calibration.calibrate` (every node budget 2..64, :data:`DRAWS` Monte Carlo
    draws) for each drafter on ``frames`` calibration frames (codes re-sampled from p); writes
    ``trees/<drafter>.json``. Returns the paths."""
    cal_frames = calibration_frames(lm, max_frames=frames, seed=seed, progress=progress)
    sampling = inner_sampling(lm)
    out = []
    for name in progress_bar(drafters, desc="calibrating trees", enabled=progress, unit="drafter"):
        drafter = shipped_drafter(lm, name, lm.code_predictor)
        cal = calibrate(lm.code_predictor, drafter, cal_frames, sampling=sampling, budgets=BUDGETS, draws=DRAWS,
                        seed=seed)
        cal["provenance"] = provenance(dict(model=lm.name, drafter=name, n_calibration_frames=frames,
                                            n_frames=len(cal_frames), draws=DRAWS, seed=seed,
                                            threads=torch.get_num_threads(), budgets=list(BUDGETS),
                                            device=lm.device, dtype=lm.dtype, command="rvqspec prepare",
                                            drafter_sha1=_drafter_digest(folder, name)),
                                 seed=seed)
        out.append(save_calibration(cal, tree_file(folder, name)))
    return out


# ---- 4. auto ----------------------------------------------------------------------------------------------------------
def _with_code_predictor_dtype(lm: LoadedModel, dtype: torch.dtype, fn: Callable):
    """``fn()`` with the code predictor cast to ``dtype`` (what ``synth --dtype`` loads), cast back after."""
    cp = lm.code_predictor
    old = next(cp.parameters()).dtype
    if old == dtype:
        return fn()
    cp.to(dtype)
    try:
        return fn()
    finally:
        cp.to(old)


#: The ``synth --dtype`` values ``auto`` is timed for (float16: what ``--dtype auto`` loads a float16 checkpoint in on a
#: GPU).
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_auto_dtypes(lm: LoadedModel) -> list[str]:
    """The dtype ``auto`` is timed for by default: the one a default ``synth`` (``--dtype auto``) loads ``lm``'s model
    in on ``lm``'s device (:func:`~rvqspec_lib.models.loader.auto_dtype`), whose cached choice that synth reads."""
    return [auto_dtype(lm.name, lm.device) or lm.dtype]


def time_auto(lm: LoadedModel, dtypes: Sequence[str], *, progress: bool = False, **options) -> list[str]:
    """Stage 4: ``--decoder auto``'s choice for each of ``dtypes`` (names of :data:`_DTYPES`: the code predictor
    cast to it, as ``synth --dtype`` loads it), timed on the calibration split's first contexts and cached
    (:func:`~rvqspec_lib.eval.budget.auto_decoder`, the key ``synth --decoder auto`` reads; ``options``: its
    timing keywords, e.g. ``frames``, ``repeats``). Returns one line a dtype.

    Raises:
        ValueError: no calibrated trees of the heads or no calibration split (the earlier stages' outputs)."""
    cal = drafter_calibration(lm, "heads")
    if cal is None:
        raise ValueError(f"no calibrated trees of the heads for {lm.name}: run the trees stage first")
    contexts = frames_from_shipped(lm, "calibration", max_frames=budget.AUTO_CONTEXTS).context  # the model's dtype
    lines = []
    for name in dtypes:
        dtype = _DTYPES[name]
        choice = _with_code_predictor_dtype(lm, dtype, lambda: budget.auto_decoder(
            lm.name, lm.code_predictor, cal, contexts.to(dtype), backends=budget.auto_backends(name, lm.device), drafter_name="heads",
            progress=progress, **options))
        lines.append(f"{name}: {choice.reason}")
    return lines


def auto_cached(lm: LoadedModel, dtypes: Sequence[str]) -> bool:
    """Every dtype's choice is in the cache already (the key ``synth --decoder auto`` reads)."""
    cal = drafter_calibration(lm, "heads")
    if cal is None:
        return False
    store = budget.read_cache(budget.cache_file())
    for name in dtypes:
        key = _with_code_predictor_dtype(lm, _DTYPES[name], lambda: budget.cache_key(
            lm.name, lm.code_predictor, cal, "heads", budget.auto_backends(name, lm.device)))
        if json.dumps(key, sort_keys=True) not in store:  # the store's own key (budget.auto_decoder)
            return False
    return True


# ---- all of it --------------------------------------------------------------------------------------------------------
def prepare(lm: LoadedModel, *, frames: int = DEFAULT_FRAMES, seed: int = 0,
            auto_dtypes: Sequence[str] | None = None, stages: Sequence[str] = STAGES, progress: bool = False,
            auto_options: dict | None = None, frames_per_text: int = MAX_FRAMES_PER_TEXT,
            say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)) -> Prepared:
    """Prepare a loaded checkpoint (or hub model) for ``--decoder paper``, ``--decoder auto`` and ``--stream``:
    the stages of the module docstring, each skipped when complete, into
    :func:`~rvqspec_lib.models.drafter_files.model_drafter_dir` (made here).

    Args:
        lm: the loaded model, on its device and in its dtype. frames: calibration frames (the training split as
            many, the validation split a fifth). seed: of speaking, training and calibration. auto_dtypes: the
            ``synth --dtype`` values ``auto`` is timed for (default :func:`default_auto_dtypes`: a default synth's).
        stages: which of :data:`STAGES` to run (each needs the earlier ones' outputs). auto_options: timing
            keywords of :func:`~rvqspec_lib.eval.budget.choose_decoder` (default its own). frames_per_text: the
            frame cap of one spoken text. say: where a line per stage goes.

    Raises:
        ValueError: a model with no folder of its own (tiny-random, the random-size models), an unknown stage or
            dtype, ``frames < 1`` (one line each).
    """
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise ValueError(f"unknown stage(s) {', '.join(bad)}: choose among {', '.join(STAGES)}")
    bad = [d for d in auto_dtypes or () if d not in _DTYPES]
    if bad:
        raise ValueError(f"auto is timed for {', '.join(_DTYPES)}, not {', '.join(bad)}")
    targets = split_targets(frames)
    folder = model_drafter_dir(lm)
    if folder is None:
        raise ValueError(f"{lm.name} has no folder of its own to prepare (random weights built in memory): use a "
                         "checkpoint folder, a hub id or the embedded model")
    auto_dtypes = list(auto_dtypes or default_auto_dtypes(lm))
    folder.mkdir(parents=True, exist_ok=True)
    results = []

    def run(stage: str, complete: bool, work: Callable[[], tuple[list, str]]):
        if stage not in stages:
            return
        t0 = time.perf_counter()
        if complete:
            res = StageResult(stage, True, 0.0, [], "complete already: skipped")
        else:
            outputs, note = work()
            res = StageResult(stage, False, time.perf_counter() - t0, [str(p) for p in outputs], note)
        results.append(res)
        say(f"prepare {stage}: {res.note}" + (f" ({res.seconds:.0f} s)" if not res.skipped else ""))

    n_texts = len(calibration_texts())
    try:  # our own models (the embedded one) ship their utterances beside their folder: nothing to speak
        shipped = embedded_root(lm) != folder
    except FileNotFoundError:
        shipped = False

    def do_speak():
        rows = speak(lm, folder, targets, seed=seed, max_frames_per_text=frames_per_text, progress=progress)
        have = _split_frames(rows)
        return [folder / "utterances.safetensors"], (f"{len(rows)} utterances spoken, frames " +
                                                    ", ".join(f"{s} {have[s]}" for s in targets))

    run("speak", shipped or _speak_complete(folder, targets, n_texts), do_speak)

    def do_offsets():
        p = train_offsets(lm, folder, targets, seed=seed, progress=progress)
        return [p], f"offsets trained -> {p}"

    run("offsets", _drafter_complete(lm, drafter_path(folder, "offsets")), do_offsets)
    names = ["heads"] + [n for n in shipped_drafters(folder) if n in DRAFTERS]  # what decoder names read
    todo = [n for n in names if not _trees_complete(lm, n, tree_file(folder, n), frames)]

    def do_trees():
        paths = calibrate_trees(lm, folder, todo, frames, seed=seed, progress=progress)
        return paths, f"calibrated the trees of {', '.join(todo)} on {frames} frames"

    run("trees", not todo, do_trees)

    def do_auto():
        lines = time_auto(lm, auto_dtypes, progress=progress, **(auto_options or {}))
        return [budget.cache_file()], "; ".join(lines)

    cached = auto_cached(lm, auto_dtypes)
    run("auto", cached, do_auto)
    if results and results[-1].stage == "auto" and not cached:  # timed now: cached unless disturbed or unwritable
        cached = auto_cached(lm, auto_dtypes)
    return Prepared(folder, results, lm.device, lm.dtype, cached)
