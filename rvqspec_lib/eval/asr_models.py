"""The recognisers of WER parity, by name: PocketSphinx offline, Whisper large-v3-turbo and Parakeet through
``transformers`` for users who have them (docs/offline.md#asr-for-wer: nothing here downloads them).

* :func:`whisper_asr`: ``WhisperForConditionalGeneration`` (default ``openai/whisper-large-v3-turbo``, the paper's
  recogniser family) behind :class:`rvqspec_lib.eval.asr.TransformersASR`, its language forced per language;
* :func:`parakeet_asr`: ``ParakeetForCTC`` (default ``nvidia/parakeet-ctc-1.1b``, English only) behind the same
  interface;
* :func:`recogniser`: ``--asr`` names (``auto``, ``none``, ``pocketsphinx``, ``pocketsphinx-prompt``,
  ``whisper[:PATH]``, ``parakeet[:PATH]``) -> a recogniser for one language, or ``None`` where none applies.
"""

from __future__ import annotations

from typing import Sequence

from rvqspec_lib.eval.asr import ASR, PocketSphinxASR, TransformersASR
from rvqspec_lib.eval.datasets import get_language

WHISPER_TURBO = "openai/whisper-large-v3-turbo"
PARAKEET = "nvidia/parakeet-ctc-1.1b"
ASR_FORMS = "auto, none, pocketsphinx, pocketsphinx-prompt, whisper[:PATH], parakeet[:PATH]"


def whisper_asr(model: str = WHISPER_TURBO, *, language: str | None = None, device: str = "cpu") -> TransformersASR:
    """Whisper through a transformers pipeline, the language forced (``language`` an ISO code; ``None``: detect).

    Raises:
        FileNotFoundError: the model is neither a local folder nor in the cache (offline: download it elsewhere).
        ValueError: an unknown language code.
    """
    name = get_language(language).name if language else None
    asr = TransformersASR(model, device=device, language=name)
    asr.name = f"whisper:{model}"
    return asr


def parakeet_asr(model: str = PARAKEET, *, language: str = "en", device: str = "cpu") -> TransformersASR:
    """Parakeet CTC through a transformers pipeline (English only, as the released CTC checkpoints).

    Raises:
        ValueError: a language other than English. FileNotFoundError: the model cannot be loaded.
    """
    if language != "en":
        raise ValueError(f"Parakeet CTC recognises English only, not {language!r}: use whisper for other languages")
    asr = TransformersASR(model, device=device)
    asr.name = f"parakeet:{model}"
    return asr


def check_asr_name(spec: str) -> None:
    """Raise ``ValueError`` (one line) unless ``spec`` is one of :data:`ASR_FORMS`."""
    kind = (spec or "").partition(":")[0]
    if kind not in ("auto", "none", "pocketsphinx", "pocketsphinx-prompt", "whisper", "parakeet"):
        raise ValueError(f"unknown recogniser {spec!r}: use {ASR_FORMS}")


def recogniser(spec: str, language: str, refs: Sequence[str] = (), *, device: str = "cpu") -> ASR | None:
    """The recogniser named by ``spec`` for one language, or ``None`` where none applies offline.

    ``auto`` and ``pocketsphinx-prompt``: PocketSphinx with a bigram LM of the references (PROMPT-INFORMED, see
    :meth:`rvqspec_lib.eval.asr.PocketSphinxASR.from_texts`) for English, none elsewhere; ``pocketsphinx``: its default
    English LM; ``whisper[:PATH]`` / ``parakeet[:PATH]``: :func:`whisper_asr` / :func:`parakeet_asr` (Parakeet:
    English only, ``None`` elsewhere); ``none``: no recogniser.

    Raises:
        ValueError: an unknown name or language.
    """
    check_asr_name(spec)
    get_language(language)
    kind, _, arg = spec.partition(":")
    if kind == "none":
        return None
    if kind in ("auto", "pocketsphinx-prompt"):
        return PocketSphinxASR.from_texts(refs) if language == "en" else None
    if kind == "pocketsphinx":
        return PocketSphinxASR() if language == "en" else None
    if kind == "whisper":
        return whisper_asr(arg or WHISPER_TURBO, language=language, device=device)
    return parakeet_asr(arg or PARAKEET, device=device) if language == "en" else None


__all__ = ["WHISPER_TURBO", "PARAKEET", "ASR_FORMS", "whisper_asr", "parakeet_asr", "check_asr_name", "recogniser"]
