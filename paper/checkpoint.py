"""The notebooks on a released checkpoint (``make paper MODEL=<checkpoint folder or hub id>``): the model speaks its
own frames (``rvqspec prepare``'s stages, small in smoke mode, reused when the checkpoint was prepared already) plus
an evaluation split of held-out texts, and what a notebook cannot do on the checkpoint is said on the console and
recorded as a headline entry (docs/results.md), never done on another model in its place.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from rvqspec_lib.common.files import json_text, write_text_atomic
from rvqspec_lib.common.machine import on_cpu  # noqa: F401  (the notebooks import it from here)
from rvqspec_lib.common.paths import DATA_DIR
from rvqspec_lib.common.progress import progress_file
from rvqspec_lib.data.utterances import load_codes, write_shipped_utterances
from rvqspec_lib.models import loader
from rvqspec_lib.models.loader import checkpoint_on_cpu, is_checkpoint  # noqa: F401  (notebooks import it here)
from rvqspec_lib.models.drafter_files import PREPARED, cache_model_dir, model_drafter_dir
from rvqspec_lib.models.frame import synthesize
from rvqspec_lib.training import prepare as P

#: Held-out texts the checkpoint speaks for its evaluation split (the embedded model's evaluation sentences).
EVAL_TEXTS = DATA_DIR / "eval_texts" / "en_evaluation.tsv"
#: (calibration frames, frames per text, evaluation texts, evaluation frames per text): a smoke run, a full run, and
#: a full run with the notebooks' CPU sizes (:func:`takes_cpu_sizes`, :func:`cpu_sized`): fewer frames, as those notebooks
#: train on at most 400 and calibrate on at most 100, and a smaller evaluation split (a real-size model speaks a few
#: frames a second on one core, and random weights never end a sentence, so each text runs to its frame limit).
SIZES = {"smoke": (48, 24, 4, 12), "full": (P.DEFAULT_FRAMES, P.MAX_FRAMES_PER_TEXT, 24, P.MAX_FRAMES_PER_TEXT),
         "cpu": (600, P.MAX_FRAMES_PER_TEXT, 8, 64)}


def say(line: str) -> None:
    """``line`` on stderr: into the executed notebook, and also onto the console ``make paper`` runs in (the
    kernel's original standard error, where ``RVQSPEC_PROGRESS=console`` sends the progress bars)."""
    print(line, file=sys.stderr, flush=True)
    console = progress_file()
    if console is not None and sys.stderr is not sys.__stderr__:
        print(line, file=console, flush=True)


def not_here(notebook: str, what: str, why: str, source: str) -> dict:
    """One line on stderr (``make paper`` shows it) saying what ``notebook`` did not do on the checkpoint and why;
    returns the headline entry that puts the same sentence into docs/results.md (``source``: the notebook's file)."""
    say(f"{notebook}: not on this checkpoint: {what} ({why})")
    return {"text": f"{what} ({why})", "value": "not measured on this checkpoint", "unit": "", "source": source,
            "glance": False}  # tools.results_doc.entry's form (paper/ does not import tools/)


def cpu_sized(notebook: str, values: dict, cpu_sizes: dict | None, *, applies: bool) -> dict:
    """The sizes a full run on a real-size checkpoint takes on the CPU, where the notebooks' own full sizes (made for
    the small embedded model) would run for hours: ``values`` (parameter name -> the notebook's value) with each
    name of ``cpu_sizes`` (the notebook's ``cpu_sizes`` parameter) put in, a number as the smaller of the two (a
    notebook's 0 or None, "all", counts as the larger), a tuple or list in place of the notebook's. Nothing changes unless ``applies`` (a real-size checkpoint, not a
    smoke run, the models on the CPU) and ``cpu_sizes`` is non-empty. When something changes, one line on stderr and
    the console (:func:`say`) names each change. Returns the new values (``values`` is not modified). Raises
    KeyError: a name of ``cpu_sizes`` that ``values`` does not hold (a misspelt parameter)."""
    out = dict(values)
    if not applies or not cpu_sizes:
        return out
    changed = []
    for name, cap in cpu_sizes.items():
        if name not in values:
            raise KeyError(f"cpu_sizes names {name!r}, which notebook {notebook} does not size: use one of "
                           f"{', '.join(values)}")
        new = tuple(cap) if isinstance(cap, (list, tuple)) else cap if values[name] in (0, None) \
            else min(values[name], cap)  # 0 or None: "all" in the notebooks, the largest
        old = tuple(values[name]) if isinstance(values[name], (list, tuple)) else values[name]
        if new != old:
            out[name] = new
            changed.append(f"{name} {_brief(old)} -> {_brief(new)}")
    if changed:
        say(f"{notebook}: sized for a checkpoint on the CPU (its cpu_sizes parameter; "
            f"`make paper CPU_SIZES=0` keeps the full sizes): {'; '.join(changed)}")
    return out


def _brief(v) -> str:
    return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)


@contextmanager
def _locked(folder: Path):
    """One notebook at a time prepares a folder (``make paper`` runs notebooks side by side)."""
    with open(folder / ".notebooks.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file, on success or error, releases the lock


def speak_evaluation(lm, folder: Path, *, n_texts: int, max_frames: int, seed: int = 0) -> int:
    """Add an ``evaluation`` split to ``folder/utterances.safetensors``: the model speaks the first ``n_texts``
    held-out texts of :data:`EVAL_TEXTS` (at most ``max_frames`` frames each, its own sampling, the speakers in turn).
    Nothing is spoken when the split exists. Returns the number of evaluation utterances."""
    path = folder / "utterances.safetensors"
    rows = [json.loads(x) for x in path.with_suffix(".jsonl").read_text().splitlines() if x.strip()]
    have = [r for r in rows if r["split"] == "evaluation"]
    if have:
        return len(have)
    codes = load_codes(path)
    texts = P.calibration_texts(EVAL_TEXTS)[: int(n_texts)]
    speakers = sorted(lm.model.config.talker_config.spk_id or {})
    for b, start in enumerate(range(0, len(texts), P.SPEAK_BATCH)):
        batch = texts[start: start + P.SPEAK_BATCH]
        speaker = speakers[b % len(speakers)] if speakers else None
        gen = torch.Generator(device=lm.device).manual_seed(seed * 1_000_003 + 777_777 + b)
        res = synthesize(lm, batch, generator=gen, max_frames=int(max_frames), speaker=speaker)
        for j, text in enumerate(batch):
            n = int(res.frames[j])
            if n:
                rid = f"evaluation-{start + j:05d}"
                codes[rid] = res.codes[j][:n].numpy().astype(np.int16)
                rows.append({"id": rid, "split": "evaluation", "language": "auto", "voice": speaker or "",
                             "text": text, "source": "spoken by the model", "seconds": n / lm.frame_rate_hz,
                             "frames": n})
    write_shipped_utterances(rows, codes, path)
    write_text_atomic(path.with_suffix(".jsonl"),
                      "".join(json_text(r, indent=None, ensure_ascii=False) + "\n" for r in rows))  # keeps text_index
    return sum(r["split"] == "evaluation" for r in rows)


def takes_cpu_sizes(model, *, smoke: bool, cpu_sizes: dict | None, device: str = "auto") -> bool:
    """Whether a notebook's run takes its CPU sizes (:func:`cpu_sized`): a full run (not ``smoke``) of a released
    checkpoint whose models run on the CPU (``device``, the notebook's parameter or ``"auto"``:
    :func:`~rvqspec_lib.models.loader.checkpoint_on_cpu`), with ``cpu_sizes`` given (``None``/``{}``: the full
    sizes, ``make paper CPU_SIZES=0``). Raises ValueError: a device that is not present (one line)."""
    return bool(cpu_sizes) and not smoke and checkpoint_on_cpu(model, device)


def prepare_checkpoint(model, *, smoke: bool, notebook: str, out_dir, seed: int = 0, cpu_sizes: dict | None = None,
                       device: str = "auto") -> Path:
    """The checkpoint's own frames, offsets and calibrated trees (``rvqspec prepare``'s stages ``speak``, ``offsets``
    and ``trees``, each skipped where complete: a prepared checkpoint is reused) and an evaluation split
    (:func:`speak_evaluation`), at :data:`SIZES` (a full run's CPU sizes where :func:`takes_cpu_sizes` says so for
    ``cpu_sizes`` on the device it is prepared on; the first notebook to speak the evaluation split sets its size for
    the folder); loads the model as ``rvqspec prepare`` does: on ``device`` (``auto``: CUDA, then MPS, then the CPU) in its stored dtype where that device runs
    it well, else float32 (bfloat16 for a released checkpoint on a GPU or a CPU with native bfloat16:
    :func:`~rvqspec_lib.common.machine.load_dtype`, docs/model.md#device-and-dtype). A full run writes where
    ``rvqspec prepare`` does (beside the checkpoint, or the project's cache folder); a ``smoke`` run of a checkpoint
    not prepared yet writes nothing there: its small preparation goes to a cache folder under ``out_dir``
    (``$RVQSPEC_CACHE`` set for this process, so every command of the notebook finds it). Returns the folder of the
    prepared files. Progress and one line a stage go to stderr and the console (:func:`say`)."""
    cpu = takes_cpu_sizes(model, smoke=smoke, cpu_sizes=cpu_sizes, device=device)
    frames, per_text, n_eval, eval_frames = SIZES["smoke" if smoke else "cpu" if cpu else "full"]
    if smoke and not any((model_drafter_dir(str(model)) / f).exists() for f in PREPARED):
        os.environ["RVQSPEC_CACHE"] = str(Path(out_dir) / "checkpoint_cache")
        (cache_model_dir(str(model)) / "drafters").mkdir(parents=True, exist_ok=True)  # model_drafter_dir: here
    lm = loader.load_model(str(model), device=device, dtype="auto")
    folder = model_drafter_dir(lm)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        P.prepare(lm, frames=frames, seed=seed, stages=("speak", "offsets", "trees"), frames_per_text=per_text,
                  progress=True, say=lambda msg: say(f"{notebook}: {msg}"))
        n = speak_evaluation(lm, folder, n_texts=n_eval, max_frames=eval_frames, seed=seed)
    say(f"{notebook}: {model}: its own frames, offsets and trees in {folder} ({n} evaluation utterances; "
        f"prepared on {lm.device} in {lm.dtype})")
    return folder


def round_trip(codec, utterances) -> dict:
    """The checkpoint's own 12 Hz codec on its own speech: each utterance's codes ``(frames, 16)`` decoded to audio
    and the audio encoded again. Returns ``{"rows": [{k, prefix_kept}], "per_codebook": [{codebook, kept}],
    "lsd_db", "frames"}``: the share of frames whose first ``k`` codes all survive the round trip, the share of codes
    of each codebook that survive, and the log-spectral distance (dB) of the re-decoded audio to the first decoding."""
    same, lsd, n_frames = [], [], 0
    for u in utterances:
        codes = np.asarray(u.codes if hasattr(u, "codes") else u, dtype=np.int64)
        wav = codec.decode(codes)
        again = codec.encode(wav)
        n = min(len(codes), len(again))
        same.append(codes[:n] == again[:n])
        wav2 = codec.decode(again)
        lsd.append(_lsd_db(wav, wav2))
        n_frames += n
    eq = np.concatenate(same)  # (frames, 16)
    k_max = min(16, eq.shape[1])
    return {"rows": [{"k": k, "prefix_kept": float(eq[:, :k].all(1).mean())} for k in range(1, k_max + 1)],
            "per_codebook": [{"codebook": g, "kept": float(eq[:, g].mean())} for g in range(eq.shape[1])],
            "lsd_db": float(np.mean(lsd)), "frames": n_frames}


def _lsd_db(a: np.ndarray, b: np.ndarray) -> float:
    n = min(len(a), len(b))
    if n < 1024:
        return float("nan")
    win = torch.hann_window(1024)
    spec = [torch.stft(torch.from_numpy(x[:n].astype(np.float32)), 1024, 256, window=win, return_complex=True)
            .abs().pow(2).clamp_min(1e-10).log10() * 10 for x in (a, b)]
    return float((spec[0] - spec[1]).pow(2).mean(0).sqrt().mean())
