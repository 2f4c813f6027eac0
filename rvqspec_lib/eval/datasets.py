"""The paper's speech data through ``datasets``, and the languages of its Table 3 (docs/offline.md: none of it can
be downloaded here; users who have it pass a local folder, or a hub id where the network or the cache allows).

* :data:`LANGUAGES`: the six languages of Table 3 with their Fleurs config, prompt language name, espeak-ng voice
  and error-rate unit (CER for Chinese and Japanese);
* :func:`load_speech_dataset`: Fleurs (evaluation, one config per language), LibriSpeech (calibration) and
  VoxPopuli (training), from a ``save_to_disk`` folder (a Fleurs root may hold one folder per config, e.g.
  ``fleurs/de_de``) or a hub id, with the schema checked (a one-line error names the missing column);
* :func:`speech_items`: the rows as ``{"id", "text", "wav", "sample_rate", "seconds"}`` (audio decoded with
  soundfile, no torchcodec needed);
* :func:`encode_items`: rows -> :class:`~rvqspec_lib.data.teacher.Utterance` (text + codec codes) with the
  Table 1 fields (``seconds``, ``frames``);
* :func:`speaking`: while inside, a phoneme model (the embedded one) reads the language's espeak-ng phonemes, and the
  prompt language is the one the checkpoint lists (``"auto"`` otherwise).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from rvqspec_lib.models.audio import _decode_audio, resample
from rvqspec_lib.data.teacher import Utterance


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
    """Make ``lm`` read text of ``language`` for the duration of the block; yields the prompt language to pass.

    A phoneme front end (:class:`rvqspec_lib.models.frontend.PhonemeTokenizer`, the embedded model) is swapped for
    one with the language's espeak-ng voice (restored on exit, also on error); a checkpoint's own tokenizer is kept.
    The prompt language is the language's name when the checkpoint lists it, else ``"auto"``.

    Raises:
        ValueError: an unknown language code.
    """
    from rvqspec_lib.models.frontend import PhonemeTokenizer

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


# ----------------------------------------------------------------------------------------------------------------
# loaders
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schema:
    """Columns of one of the paper's data sets (as published on the hub).

    Attributes:
        kind: ``fleurs`` | ``librispeech`` | ``voxpopuli``. hub: its hub id. role: what the paper used it for.
        audio: the audio column. text: text columns in order of preference (the first non-empty one is read).
        id: the id column.
    """

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
    """The first ``*.arrow`` file under ``folder`` (a ``save_to_disk`` folder; sub-folders of a ``DatasetDict``
    included) that pyarrow cannot read to its end, with pyarrow's reason; ``None`` when every one reads.

    ``save_to_disk`` writes Arrow IPC streams; a copy cut short (an interrupted download or ``cp``) fails inside
    ``load_from_disk`` with a pyarrow message that names neither the file nor the fix. Each file is read completely
    (memory-mapped), so this is for the error path, not for every load.
    """
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
    """One split of Fleurs, LibriSpeech or VoxPopuli, with its columns checked.

    Args:
        source: a folder written by ``save_to_disk`` (a ``Dataset`` or ``DatasetDict``; for Fleurs, a root holding
            one such folder per config, ``<root>/de_de``, works too), or a hub id (``google/fleurs``,
            ``openslr/librispeech_asr``, ``facebook/voxpopuli``): that needs the network or the Hugging Face cache.
        kind: ``"fleurs"``, ``"librispeech"`` or ``"voxpopuli"`` (:data:`SCHEMAS`).
        language: ISO code (:data:`LANGUAGES`); Fleurs picks the language's config, VoxPopuli the language config
            (``en``); a dataset with a ``language`` / ``lang_id`` column of names is filtered on it.
        split: a split of a ``DatasetDict`` (default ``test``, else ``validation``, else ``train``).
    Returns:
        ``datasets.Dataset`` whose audio column is left undecoded (read by :func:`speech_items`).
    Raises:
        ValueError: an unknown kind or language, a dataset without the expected columns, a missing split, an Arrow
            file cut short (naming the file, :func:`damaged_arrow_file`), or a hub id that cannot be reached (all one
            line, naming the fix).
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
    """Rows of a dataset from :func:`load_speech_dataset` as ``{"id", "text", "wav" (float32 mono), "sample_rate",
    "seconds"}``; rows with empty text are skipped.

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


def encode_items(items: Sequence[dict], codec, *, n_code_groups: int, language: str = "auto",
                 speaker: str | None = None) -> tuple[list[Utterance], list[dict]]:
    """Encode rows of :func:`speech_items` (or any ``{"text", "wav", "sample_rate"}`` dicts) into utterances.

    Args:
        codec: ``encode(wav) -> (frames, n_code_groups)`` at ``codec.sample_rate`` (or ``codec.config.sample_rate``;
            24 kHz if neither); audio at another rate is resampled first.
        n_code_groups: codes per frame the model expects (16).
        language, speaker: the prompt settings stored on each utterance.
    Returns:
        ``(utterances, meta)``: meta rows hold ``id``, ``seconds`` (audio) and ``frames`` (codec frames), for the
        Table 1 analogue (:func:`rvqspec_lib.eval.parity.table1_rows`). Rows with no frame are skipped.
    Raises:
        ValueError: codes of the wrong shape (a codec of another model).
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
        utts.append(Utterance(it["text"], codes, speaker, language))
        meta.append({"id": it.get("id", str(i)), "seconds": float(len(it["wav"]) / float(it["sample_rate"])),
                     "frames": int(codes.shape[0])})
    return utts, meta


__all__ = ["Language", "LANGUAGES", "get_language", "speaking", "Schema", "SCHEMAS", "load_speech_dataset",
           "speech_items", "encode_items"]
