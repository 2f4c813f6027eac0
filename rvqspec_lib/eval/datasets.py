"""The paper's speech data through ``datasets`` (Fleurs for evaluation, LibriSpeech for calibration, VoxPopuli for
training) and the languages of its Table 3 (:data:`LANGUAGES`). None of it can be downloaded here (docs/offline.md):
users pass a ``save_to_disk`` folder, or a hub id where the network or the cache allows."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from rvqspec_lib.data.teacher import Utterance
from rvqspec_lib.models.audio import _decode_audio, resample
from rvqspec_lib.models.frontend import PhonemeTokenizer


@dataclass(frozen=True)
class Language:
    """One language of Table 3.

    Attributes:
        code: ISO 639-1. name: the prompt language of Qwen3-TTS checkpoints (``codec_language_id`` key).
        fleurs: the Fleurs config. espeak: the espeak-ng voice of a phoneme front end.
        unit: ``"word"`` (WER) or ``"char"`` (CER: scripts without spaces between words).
    """

    code: str
    name: str
    fleurs: str
    espeak: str
    unit: str = "word"


#: Table 3's languages (paper: English plus five Fleurs languages).
LANGUAGES = {lang.code: lang for lang in (
    Language("en", "english", "en_us", "en-us"),
    Language("de", "german", "de_de", "de"),
    Language("es", "spanish", "es_419", "es"),
    Language("ru", "russian", "ru_ru", "ru"),
    Language("ja", "japanese", "ja_jp", "ja", "char"),
    Language("zh", "chinese", "cmn_hans_cn", "cmn", "char"),
)}


def get_language(code: str) -> Language:
    """The :class:`Language` of an ISO code. Raises ``ValueError`` (one line) for another code."""
    if code not in LANGUAGES:
        raise ValueError(f"unknown language {code!r}: use one of {', '.join(LANGUAGES)}")
    return LANGUAGES[code]


@contextlib.contextmanager
def speaking(lm, language: str) -> Iterator[str]:
    """Make ``lm`` read text of ``language`` inside the block; yields the prompt language to pass (the language's name
    when the checkpoint lists it, else ``"auto"``). A phoneme front end is swapped for the language's espeak-ng voice
    and restored on exit; a checkpoint's own tokenizer is kept.

    Raises:
        ValueError: an unknown language code.
    """
    lang = get_language(language)
    listed = set(lm.model.config.talker_config.codec_language_id or {})
    prompt = lang.name if lang.name in listed else "auto"
    old = lm.tokenizer
    if isinstance(old, PhonemeTokenizer) and old.voice != lang.espeak:
        lm.tokenizer = PhonemeTokenizer(old.im_start, old.im_end, old.assistant, voice=lang.espeak,
                                        alphabet=old.alphabet, espeak=old.espeak)
    try:
        yield prompt
    finally:
        lm.tokenizer = old


# ---- loaders ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schema:
    """Columns of one of the paper's data sets as published on the hub: ``kind``, ``hub`` id, ``role``, ``audio``
    column, ``text`` columns in order of preference, ``id`` column."""

    kind: str
    hub: str
    role: str
    audio: str
    text: tuple
    id: str


SCHEMAS = {s.kind: s for s in (
    Schema("fleurs", "google/fleurs", "evaluation", "audio", ("raw_transcription", "transcription"), "id"),
    Schema("librispeech", "openslr/librispeech_asr", "calibration", "audio", ("text",), "id"),
    Schema("voxpopuli", "facebook/voxpopuli", "training", "audio", ("raw_text", "normalized_text"), "audio_id"),
)}


def _pick_split(ds, split: str | None, where: str):
    import datasets as hf

    if isinstance(ds, hf.DatasetDict):
        if split is None:
            split = next((s for s in ("test", "validation", "train") if s in ds), list(ds)[0])
        if split not in ds:
            raise ValueError(f"{where} has no split {split!r}: it has {', '.join(ds)}")
        return ds[split]
    return ds


def damaged_arrow_file(folder: str | os.PathLike) -> tuple[Path, str] | None:
    """The first ``*.arrow`` file under a ``save_to_disk`` folder that pyarrow cannot read to its end, with the reason,
    or ``None``: a copy cut short fails inside ``load_from_disk`` naming neither file nor fix. Reads every file
    (memory-mapped): for the error path only."""
    import pyarrow as pa

    for f in sorted(Path(folder).rglob("*.arrow")):
        try:
            with pa.memory_map(str(f)) as src:
                pa.ipc.open_stream(src).read_all()
        except (pa.ArrowException, OSError, ValueError) as e:
            return f, str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    return None


def load_speech_dataset(source: str | os.PathLike, kind: str, *, language: str | None = None,
                        split: str | None = None):
    """One split of Fleurs, LibriSpeech or VoxPopuli, its columns checked, its audio left undecoded.

    Args:
        source: a ``save_to_disk`` folder (for Fleurs also a root of one folder per config, ``<root>/de_de``), or a
            hub id (needs the network or the cache).
        kind: a key of :data:`SCHEMAS`. language: ISO code: Fleurs' and VoxPopuli's config, or a filter on a
            ``language`` / ``lang_id`` column. split: default ``test``, else ``validation``, else ``train``.

    Raises:
        ValueError: an unknown kind or language, missing columns or split, a damaged Arrow file
            (:func:`damaged_arrow_file`), an unreachable hub id (one line each, naming the fix).
    """
    import datasets as hf

    if kind not in SCHEMAS:
        raise ValueError(f"unknown dataset kind {kind!r}: use one of {', '.join(SCHEMAS)}")
    schema = SCHEMAS[kind]
    lang = get_language(language) if language is not None else None
    config = lang.fleurs if (kind == "fleurs" and lang) else (lang.code if (kind == "voxpopuli" and lang) else None)
    p = Path(source).expanduser()
    if p.exists():
        sub = p / config if config and (p / config).is_dir() else p
        try:
            ds = hf.load_from_disk(str(sub))
        except (FileNotFoundError, ValueError, OSError) as e:  # pyarrow's errors are ValueError / OSError
            damaged = damaged_arrow_file(sub)
            if damaged is not None:
                file, why = damaged
                raise ValueError(f"{file} is cut short or damaged ({why}): copy that file again from where the "
                                 f"dataset was saved, or save the {kind} split again with datasets' save_to_disk"
                                 ) from None
            if not isinstance(e, (FileNotFoundError, ValueError)):
                raise
            raise ValueError(f"{sub} is not a dataset written by save_to_disk ({str(e).splitlines()[0][:120]}): "
                             f"save the {kind} split there with datasets' save_to_disk") from None
        where, filter_language = str(sub), sub == p
    elif str(source).startswith((".", "/", "~")):
        raise ValueError(f"no dataset folder {source}: write one with datasets' save_to_disk (nothing is "
                         "downloaded here)")
    else:
        try:
            ds = hf.load_dataset(str(source), config, split=split or "test")
        except Exception as e:  # noqa: BLE001  (offline: ConnectionError, FileNotFoundError, DatasetNotFoundError ...)
            raise ValueError(f"could not load {source!r} ({type(e).__name__}): it needs the network or the Hugging "
                             "Face cache; save it with save_to_disk where you have them and pass the folder") from None
        where, filter_language = str(source), config is None
    ds = _pick_split(ds, split, where)
    cols = ds.column_names
    text = [c for c in schema.text if c in cols]
    missing = ([schema.audio] if schema.audio not in cols else []) + ([schema.text[0]] if not text else [])
    if missing:
        raise ValueError(f"{where} has no {' or '.join(repr(m) for m in missing)} column (columns: {', '.join(cols)})"
                         f": a {kind} dataset needs {schema.audio!r} and one of {', '.join(schema.text)}")
    feat = ds.features.get(schema.audio)
    if isinstance(feat, hf.Audio) and feat.decode:  # decoded by speech_items with soundfile (no torchcodec needed)
        ds = ds.cast_column(schema.audio, hf.Audio(decode=False))
    if lang is not None and filter_language:
        col = next((c for c in ("language", "lang_id") if c in cols and isinstance(ds.features[c], hf.Value)
                    and ds.features[c].dtype == "string"), None)
        if col is not None:
            keep = {lang.code, lang.name, lang.fleurs, lang.fleurs.split("_")[0]}
            ds = ds.filter(lambda v: str(v).lower() in keep, input_columns=[col])
            if len(ds) == 0:
                raise ValueError(f"{where} has no row of language {lang.code!r} (column {col!r})")
    return ds


def speech_items(ds, kind: str, *, max_items: int | None = None) -> list[dict]:
    """Rows of :func:`load_speech_dataset`'s dataset as ``{"id", "text", "wav" (float32 mono), "sample_rate",
    "seconds"}`` (audio decoded with soundfile), rows with empty text skipped.

    Raises:
        ValueError: an unknown kind, an unreadable audio cell.
    """
    if kind not in SCHEMAS:
        raise ValueError(f"unknown dataset kind {kind!r}: use one of {', '.join(SCHEMAS)}")
    schema = SCHEMAS[kind]
    cols = ds.column_names
    out = []
    n = len(ds) if max_items is None else min(int(max_items), len(ds))
    for i in range(n):
        row = ds[i]
        text = next((str(row[c]) for c in schema.text if c in cols and row[c] and str(row[c]).strip()), "")
        if not text:
            continue
        wav, sr = _decode_audio(row[schema.audio])
        out.append({"id": str(row[schema.id]) if schema.id in cols else str(i), "text": text.strip(), "wav": wav,
                    "sample_rate": int(sr), "seconds": len(wav) / float(sr)})
    return out


def encode_items(items: Sequence[dict], codec, *, n_code_groups: int,
                 language: str = "auto") -> tuple[list[Utterance], list[dict]]:
    """Rows of :func:`speech_items` (any ``{"text", "wav", "sample_rate"}``) encoded by ``codec`` (resampled to its
    rate) into utterances with the prompt ``language`` and the default speaker.

    Returns:
        ``(utterances, meta)``: meta rows ``id``, ``seconds``, ``frames`` (Table 1); rows with no frame skipped.

    Raises:
        ValueError: codes other than ``(frames, n_code_groups)`` (a codec of another model).
    """
    sr_codec = int(getattr(codec, "sample_rate", 0) or getattr(getattr(codec, "config", None), "sample_rate", 24000))
    utts, meta = [], []
    for i, it in enumerate(items):
        codes = torch.as_tensor(np.asarray(codec.encode(resample(np.asarray(it["wav"], dtype=np.float32),
                                                                 int(it["sample_rate"]), sr_codec))),
                                dtype=torch.long)
        if codes.dim() != 2 or codes.shape[1] != n_code_groups:
            raise ValueError(f"codec returned codes of shape {tuple(codes.shape)}, expected (frames, {n_code_groups}):"
                             " use the model's own codec")
        if codes.shape[0] == 0:
            continue
        utts.append(Utterance(it["text"], codes, None, language))
        meta.append({"id": it.get("id", str(i)), "seconds": float(len(it["wav"]) / float(it["sample_rate"])),
                     "frames": int(codes.shape[0])})
    return utts, meta
