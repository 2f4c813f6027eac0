"""The evaluation data of WER parity (notebook 05, ``rvqspec eval-wer``) per language, with its Table 1 fields: a
user's data set encoded by the model's codec, or, for the embedded model offline, the shipped English splits and the
multilingual sentences rendered with espeak-ng and encoded by the shipped codec.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Sequence

from rvqspec_lib.data.frame_sources import frames_from_utterances
from rvqspec_lib.data.utterances import embedded_root, load_shipped_utterances
from rvqspec_lib.decoding.drafters import ReusedHeads
from rvqspec_lib.data.voices import DEFAULT_VOICES, VOICES, multilingual_sentences, render_corpus
from rvqspec_lib.eval.calibration import BUDGETS, calibrate
from rvqspec_lib.eval.datasets import encode_items, get_language, load_speech_dataset, speech_items
from rvqspec_lib.eval.wer_parity import best_chain_window
from rvqspec_lib.models.audio import load_wav
from rvqspec_lib.models.tree_files import load_calibration


def _shipped(model, split: str, n: int | None, seed: int, role: str):
    """``(utterances, meta, source)`` of one shipped split (``n``: a seeded sample of it)."""
    root = embedded_root(model)
    rows, utts = load_shipped_utterances(root / "utterances.safetensors", splits=[split])
    idx = list(range(len(utts)))
    if n is not None and n < len(idx):
        idx = sorted(random.Random(seed).sample(idx, n))
    meta = [{"split": split, "role": role, "language": "en", "seconds": float(rows[i]["seconds"]),
             "frames": int(utts[i].codes.shape[0]), "id": rows[i]["id"], "voice": rows[i].get("voice")}
            for i in idx]
    return [utts[i] for i in idx], meta, {"kind": "shipped", "file": str(root / "utterances.safetensors"),
                                          "split": split}


def multilingual_evaluation(codec, work_dir: str | os.PathLike, languages: Sequence[str], *,
                            n_per_language: int | None = None, progress: bool = False) -> dict:
    """``{lang: {"utterances", "meta", "source"}}``: the multilingual sentences of each requested non-English
    language rendered with espeak-ng and encoded by ``codec``. Raises MissingVoiceError: espeak-ng or sox missing."""
    wanted = [lang for lang in languages if lang != "en"]
    if not wanted:
        return {}
    sents = [s for s in multilingual_sentences() if s.language in wanted]
    if n_per_language is not None:
        sents = [s for lang in wanted for s in [x for x in sents if x.language == lang][:n_per_language]]
    voices = [v for v in DEFAULT_VOICES if VOICES[v].language in wanted]
    rows = render_corpus(sents, Path(work_dir), voices=voices, progress=progress)
    out = {}
    for lang in wanted:
        mine = [r for r in rows if r["language"] == lang]
        if not mine:
            continue
        items = [{"id": r["id"], "text": r["text"], "wav": load_wav(Path(work_dir) / r["path"], codec.sample_rate),
                  "sample_rate": codec.sample_rate} for r in mine]
        utts, meta = encode_items(items, codec, n_code_groups=16)
        out[lang] = {"utterances": utts,
                     "meta": [{**m, "split": "evaluation", "role": "WER parity, Table 3", "language": lang}
                              for m in meta],
                     "source": {"kind": "rendered", "engine": "espeak-ng", "voices": sorted({r["voice"] for r in mine}),
                                "texts": "data/eval_texts/multilingual.tsv", "folder": str(work_dir)}}
    return out


def evaluation_data(model: str | os.PathLike, languages: Sequence[str], *, codec=None, dataset=None,
                    dataset_kind: str = "fleurs", split: str | None = None, n_sentences: int | None = None,
                    n_multilingual: int | None = None, seed: int = 0, work_dir: str | os.PathLike = "build/eval_wer",
                    progress: bool = False) -> dict:
    """``{lang: {"utterances", "meta", "source"}}`` in the order of ``languages`` (ISO codes): from ``dataset`` (a
    folder or hub id of ``dataset_kind``, for EVERY language) when given, else shipped and rendered (``work_dir``);
    ``n_sentences`` a language (a seeded sample, or a dataset's first rows), ``n_multilingual`` per other language
    (default ``n_sentences``).

    Raises:
        ValueError: an unknown language; a language without data (one line naming ``--dataset``); a dataset without
            the expected columns.
    """
    for lang in languages:
        get_language(lang)
    out: dict = {}
    if dataset:
        if codec is None:
            raise ValueError("a dataset needs the codec that turns its audio into codes (--codec)")
        for lang in languages:
            ds = load_speech_dataset(dataset, dataset_kind, language=lang, split=split)
            items = speech_items(ds, dataset_kind, max_items=n_sentences)
            utts, meta = encode_items(items, codec, n_code_groups=16)
            if not utts:
                raise ValueError(f"{dataset} has no usable {lang} utterance (empty texts or audio)")
            out[lang] = {"utterances": utts, "meta": [{**m, "split": split or "test", "role": "WER parity, Table 3",
                                                       "language": lang} for m in meta],
                         "source": {"kind": dataset_kind, "dataset": str(dataset), "language": lang}}
        return out
    try:
        embedded_root(model)
    except FileNotFoundError:
        raise ValueError(f"no evaluation data for {', '.join(languages)} with model {model}: pass --dataset (a "
                         "Fleurs folder written by save_to_disk, one config per language) and --codec") from None
    if "en" in languages:
        utts, meta, src = _shipped(model, "evaluation", n_sentences, seed, "WER parity, Table 3")
        out["en"] = {"utterances": utts, "meta": meta, "source": src}
    others = [lang for lang in languages if lang != "en"]
    if others:
        if codec is None:
            raise ValueError("rendering the multilingual sentences needs the model's codec")
        have = {s.language for s in multilingual_sentences()}
        missing = [lang for lang in others if lang not in have]
        if missing:
            raise ValueError(f"no evaluation sentences for {', '.join(missing)} offline (shipped: en, "
                             f"{', '.join(sorted(have))}): pass --dataset with a Fleurs folder")
        out.update(multilingual_evaluation(codec, Path(work_dir) / "multilingual", others,
                                           n_per_language=n_multilingual or n_sentences, progress=progress))
    return {lang: out[lang] for lang in languages}


def calibration_data(model: str | os.PathLike, *, codec=None, librispeech=None, seed: int = 0):
    """``(utterances, meta, source)`` of the calibration set: ``librispeech`` (a folder or hub id, the paper's)
    encoded by ``codec``, else the shipped calibration split. Raises ValueError: neither exists; bad columns."""
    if librispeech:
        if codec is None:
            raise ValueError("LibriSpeech audio needs the model's codec to become codes")
        ds = load_speech_dataset(librispeech, "librispeech")
        utts, meta = encode_items(speech_items(ds, "librispeech"), codec, n_code_groups=16)
        return utts, [{**m, "split": "test", "role": "tree calibration", "language": "en"} for m in meta], \
            {"kind": "librispeech", "dataset": str(librispeech)}
    try:
        return _shipped(model, "calibration", None, seed, "tree calibration")
    except FileNotFoundError:
        raise ValueError(f"{model} ships no calibration split: pass a LibriSpeech folder (save_to_disk) or a "
                         "calibrated trees file, or use chain:N and explicit trees") from None


def calibrate_decoders(lm, utterances: Sequence, *, needs, calibration_path: str | os.PathLike | None = None,
                       max_frames: int = 1000, budgets: Sequence[int] | None = None, seed: int = 0,
                       progress: bool = False) -> dict:
    """What ``tree:calibrated...`` and ``chain:best`` need (``needs`` among ``{"calibration", "best_chain"}``), from a
    ``calibration_path`` file or the first ``max_frames`` frames of ``utterances`` (``budgets`` default
    :data:`BUDGETS`): ``{"calibration", "best_chain", "chain_predicted": {window: tpc}, "n_frames", "from_file"}``,
    each ``None`` (``n_frames`` 0) where not computed or read."""
    cp = lm.code_predictor
    out = {"calibration": None, "best_chain": None, "chain_predicted": {}, "n_frames": 0, "from_file": None}
    needs = set(needs)
    if "calibration" in needs and calibration_path is not None and Path(calibration_path).is_file():
        out["calibration"] = load_calibration(calibration_path, n_codes=int(cp.config.num_code_groups) - 1,
                                              codebook_size=int(cp.config.vocab_size))
        out["from_file"] = str(calibration_path)
        needs.discard("calibration")
    if not needs:
        return out
    frames = frames_from_utterances(lm, utterances, max_frames=max_frames, progress=progress)
    out["n_frames"] = len(frames)
    if "best_chain" in needs:
        out["best_chain"], out["chain_predicted"] = best_chain_window(cp, ReusedHeads(), frames)
    if "calibration" in needs:
        out["calibration"] = calibrate(cp, ReusedHeads(), frames, budgets=budgets or BUDGETS, seed=seed)
    return out
