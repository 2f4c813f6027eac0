"""Speech recognition and WER / CER (docs/model.md#recognisers, docs/offline.md#asr-for-wer,
docs/methods.md#reporting-wer): the :class:`ASR` interface, Whisper through faster-whisper or transformers,
PocketSphinx (:meth:`PocketSphinxASR.from_texts`: a PROMPT-INFORMED LM, labelled so), :func:`wer` / :func:`cer`."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import tempfile
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import jiwer
import librosa  # a lazy loader: its submodules load on first use
import numpy as np


class ASR:
    """Speech recognition interface: one method."""

    #: a short label for tables (which recogniser and which LM produced a WER figure).
    name: str = "asr"

    def transcribe(self, wav: np.ndarray, sample_rate: int) -> str:
        """Transcribe mono float audio `(samples,)` at ``sample_rate`` Hz; returns the text (may be empty)."""
        raise NotImplementedError


def _mono_float(wav) -> np.ndarray:
    wav = np.asarray(wav)
    if wav.ndim == 2:
        wav = wav.mean(axis=1) if wav.shape[1] <= 8 else wav.mean(axis=0)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio of shape (samples,), got {wav.shape}")
    if np.issubdtype(wav.dtype, np.integer):
        wav = wav.astype(np.float32) / 32768.0
    return wav.astype(np.float32, copy=False)


def _mono_at(wav, sample_rate: int, target: int) -> np.ndarray:
    """``wav`` as mono float32 at ``target`` Hz (librosa's resampler: torchaudio does not load here)."""
    wav = _mono_float(wav)
    if wav.size and int(sample_rate) != int(target):
        wav = librosa.resample(wav, orig_sr=int(sample_rate), target_sr=int(target))
    return wav


# ---- PocketSphinx ----------------------------------------------------------------------------------------------------
#: the table label of PocketSphinx with the bigram LM of the references (it knows the text it should hear).
PROMPT_INFORMED_LABEL = "pocketsphinx+prompt-informed-bigram"


class PocketSphinxASR(ASR):
    """CMU PocketSphinx 5 with its bundled US English model (16 kHz; other rates are resampled).

    Args:
        lm: an ARPA or binary LM file (``None``: the bundled 3-gram). dictionary: ``None``: the bundled CMUdict.
        label: name for tables.

    Raises:
        ImportError: pocketsphinx is not installed. FileNotFoundError: no ``lm`` file.
    """

    sample_rate = 16000

    def __init__(self, lm: str | os.PathLike | None = None, dictionary: str | os.PathLike | None = None,
                 label: str | None = None):
        try:
            from pocketsphinx import Decoder
        except ImportError as e:
            raise ImportError("pocketsphinx is not installed: pip install -r requirements.txt "
                              "(pocketsphinx 5.x bundles the English model)") from e
        kw = {"samprate": self.sample_rate, "loglevel": "FATAL"}
        if lm is not None:
            if not Path(lm).is_file():
                raise FileNotFoundError(f"no language model at {lm}")
            kw["lm"] = str(lm)
        if dictionary is not None:
            kw["dict"] = str(dictionary)
        self._decoder = Decoder(**kw)
        self.name = label or ("pocketsphinx" if lm is None else "pocketsphinx+lm")

    @staticmethod
    def dictionary_path() -> Path:
        """The bundled CMU pronunciation dictionary."""
        from pocketsphinx import get_model_path

        return Path(get_model_path()) / "en-us" / "cmudict-en-us.dict"

    @classmethod
    def from_texts(cls, texts: Iterable[str], workdir: str | os.PathLike | None = None) -> "PocketSphinxASR":
        """A recogniser whose LM is a bigram of ``texts`` (PROMPT-INFORMED), written into ``workdir`` with a dictionary
        cut down to its words (the full one takes seconds to load); words the dictionary lacks stay in the references
        as errors."""
        entries = _dictionary_entries(cls.dictionary_path())
        arpa = bigram_arpa(texts, vocabulary=set(entries))
        words = {ln.split("\t")[1] for ln in arpa.split("\\2-grams:")[0].splitlines() if ln.count("\t") >= 1}
        d = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="rvqspec-lm-"))
        d.mkdir(parents=True, exist_ok=True)
        lm_path, dict_path = d / "prompt-bigram.arpa", d / "prompt.dict"
        lm_path.write_text(arpa)
        dict_path.write_text("".join(line for w in sorted(words - {"<s>", "</s>"}) for line in entries[w]))
        return cls(lm=lm_path, dictionary=dict_path, label=PROMPT_INFORMED_LABEL)

    def transcribe(self, wav: np.ndarray, sample_rate: int) -> str:
        wav = _mono_at(wav, sample_rate, self.sample_rate)
        if wav.size == 0:
            return ""
        pcm = (np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)
        d = self._decoder
        d.start_utt()
        d.process_raw(pcm.tobytes(), no_search=False, full_utt=True)
        d.end_utt()
        hyp = d.hyp()
        return hyp.hypstr if hyp is not None else ""


def _dictionary_entries(path: Path) -> dict[str, list[str]]:
    """CMUdict lines by word (alternate pronunciations ``read(2)`` grouped under ``read``)."""
    entries: dict[str, list[str]] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            w = re.sub(r"\(\d+\)$", "", line.split(" ", 1)[0])
            entries.setdefault(w, []).append(line if line.endswith("\n") else line + "\n")
    return entries


def bigram_arpa(texts: Iterable[str], vocabulary: set[str] | None = None) -> str:
    """A bigram LM of ``texts`` (normalised, in ``<s> ... </s>``) in ARPA format: absolute discounting
    ``p(w | h) = (c(h, w) - D) / c(h)`` (D = 0.5) for seen pairs, else ``alpha(h) p(w)`` with each history summing to
    1; maximum-likelihood unigrams. ``vocabulary``: words outside it dropped. Raises ValueError: no usable words.
    """
    discount = 0.5
    uni: Counter = Counter()
    bi: Counter = Counter()
    for t in texts:
        words = [w for w in normalize_text(t).split() if vocabulary is None or w in vocabulary]
        if not words:
            continue
        seq = ["<s>", *words, "</s>"]
        uni.update(seq)
        bi.update(zip(seq[:-1], seq[1:]))
    if not bi:
        raise ValueError("no usable words in the texts for a language model")
    n_tokens = sum(c for w, c in uni.items() if w != "<s>")
    p_uni = {w: (c / n_tokens if w != "<s>" else 0.0) for w, c in uni.items()}
    hist: Counter = Counter()
    followers: dict[str, list[str]] = {}
    for (h, w), c in bi.items():
        hist[h] += c
        followers.setdefault(h, []).append(w)
    lines = ["\\data\\", f"ngram 1={len(uni)}", f"ngram 2={len(bi)}", "", "\\1-grams:"]
    for w in sorted(uni):
        lp = -99.0 if p_uni[w] == 0 else math.log10(p_uni[w])
        if w in followers:
            left = discount * len(followers[w]) / hist[w]
            covered = sum(p_uni[v] for v in followers[w])
            alpha = left / max(1.0 - covered, 1e-12) if covered < 1 - 1e-9 else 1e-12
            lines.append(f"{lp:.6f}\t{w}\t{math.log10(alpha):.6f}")
        else:
            lines.append(f"{lp:.6f}\t{w}")
    lines += ["", "\\2-grams:"]
    for (h, w), c in sorted(bi.items()):
        lines.append(f"{math.log10((c - discount) / hist[h]):.6f}\t{h} {w}")
    lines += ["", "\\end\\", ""]
    return "\n".join(lines)


# ---- faster-whisper (CTranslate2): Whisper offline on the CPU --------------------------------------------------------
def whisper_model_kind(path: str | os.PathLike) -> str:
    """``"ctranslate2"`` (``model.bin`` and ``config.json``) or ``"transformers"`` (``config.json`` of
    ``model_type`` whisper): what a local Whisper folder holds, from its files alone.

    Raises:
        FileNotFoundError: no folder at ``path``. ValueError: neither kind (one line each).
    """
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"no Whisper model folder at {path}: pass a CTranslate2 folder (model.bin + "
                                "config.json) or a transformers checkpoint, or use --asr whisper-tiny.en (the offline "
                                "one in requirements.txt)")
    if (p / "model.bin").is_file() and (p / "config.json").is_file():
        return "ctranslate2"
    try:
        model_type = json.loads((p / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type == "whisper":
        return "transformers"
    raise ValueError(f"{path} is not a Whisper model: expected model.bin + config.json (CTranslate2) or a "
                     "config.json with model_type \"whisper\" (transformers)")


#: the CPU kernels Whisper runs on, the same on every x86-64 CPU (docs/model.md#recognisers): CTranslate2's own kernels
#: (softmax, layer norm, GELU) at AVX2. Set for the process where the first recogniser is created (CTranslate2 reads it
#: when it first runs); a value already in the environment wins.
WHISPER_CPU_PINS = {"CT2_FORCE_CPU_ISA": "AVX2"}
#: (``MKL_CBWR=COMPATIBLE`` is left to the environment a run starts in: torch's oneMKL reads it too, and a variable set
#: in this process reaches every child process, where it changed torch's numbers: docs/model.md.)


def pin_whisper_cpu_kernels() -> dict[str, str]:
    """Set :data:`WHISPER_CPU_PINS` in this process's environment where unset (x86-64 only: elsewhere nothing is
    pinned); returns the values in force. Takes effect only if no CTranslate2 model ran earlier in the process."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    return {k: os.environ.setdefault(k, v) for k, v in WHISPER_CPU_PINS.items()}


class FasterWhisperASR(ASR):
    """Whisper in CTranslate2 format through ``faster-whisper`` (16 kHz; other rates resampled), deterministic and the
    same on every x86-64 CPU: float32 weights and activations, CPU kernels pinned (:func:`pin_whisper_cpu_kernels`),
    one thread, beam search (5 beams) at temperature 0 alone (no fallback), no voice-activity filter, no previous text
    (docs/model.md#recognisers).

    Args:
        model_dir: a CTranslate2 Whisper folder. language: forced on a multilingual model (``None``: detect); an
            English-only model takes English only. label: name for tables (default ``"whisper:<model_dir>"``).

    Raises:
        FileNotFoundError / ValueError: what :func:`whisper_model_kind` refuses, a transformers checkpoint, another
            language for an English-only model. ImportError: faster-whisper is not installed.
    """

    sample_rate = 16000

    def __init__(self, model_dir: str | os.PathLike, *, language: str | None = "en", label: str | None = None):
        kind = whisper_model_kind(model_dir)
        if kind != "ctranslate2":
            raise ValueError(f"{model_dir} is a transformers Whisper checkpoint, not a CTranslate2 folder: load it "
                             "with TransformersASR (--asr whisper:PATH does so)")
        try:
            from faster_whisper import WhisperModel
        except ImportError as e:
            raise ImportError("faster-whisper is not installed: pip install -r requirements.txt "
                              "(faster-whisper==1.2.1)") from e
        pin_whisper_cpu_kernels()
        self._model = WhisperModel(str(Path(model_dir).expanduser()), device="cpu", compute_type="float32",
                                   cpu_threads=1)
        if not self._model.model.is_multilingual:
            if language not in (None, "en"):
                raise ValueError(f"{model_dir} is an English-only Whisper model, not for language {language!r}: "
                                 "pass a multilingual one (whisper:PATH)")
            language = "en"
        self.language = language
        self.name = label or f"whisper:{model_dir}"

    def transcribe(self, wav: np.ndarray, sample_rate: int) -> str:
        wav = _mono_at(wav, sample_rate, self.sample_rate)
        if wav.size == 0:
            return ""
        segments, _ = self._model.transcribe(np.ascontiguousarray(wav, dtype=np.float32), language=self.language,
                                             beam_size=5, temperature=0.0,
                                             condition_on_previous_text=False, vad_filter=False)
        return " ".join(s.text.strip() for s in segments).strip()


# ---- transformers pipelines (Whisper, Parakeet, ...): need the network or a local copy -------------------------------
class TransformersASR(ASR):
    """Any ``transformers`` automatic-speech-recognition model (``openai/whisper-large-v3``, ...): ``model_id`` a hub
    id or local folder, run on the CPU; ``language`` for Whisper's ``generate_kwargs``.

    Raises:
        FileNotFoundError: a local path that does not exist, or a model that cannot be fetched (offline).
    """

    def __init__(self, model_id: str, language: str | None = None):
        p = Path(model_id).expanduser()
        if model_id.startswith((".", "/", "~")) and not p.exists():
            raise FileNotFoundError(f"no ASR model at {model_id}: download it where the network is reachable "
                                    "(huggingface-cli download MODEL --local-dir DIR) and pass DIR. "
                                    "Offline, use FasterWhisperASR (whisper-tiny.en).")
        from transformers import pipeline

        try:
            self._pipe = pipeline("automatic-speech-recognition", model=str(p) if p.exists() else model_id,
                                  device="cpu")
        except OSError as e:  # hub unreachable / offline mode / missing files
            raise FileNotFoundError(
                f"could not load ASR model {model_id!r} ({e.__class__.__name__}: "
                f"{(str(e).splitlines() or [''])[0][:200]}). It needs the network or a local copy; offline, use "
                "FasterWhisperASR (whisper-tiny.en).") from e
        self.language = language
        self.name = f"transformers:{model_id}"

    def transcribe(self, wav: np.ndarray, sample_rate: int) -> str:
        target = int(getattr(getattr(self._pipe, "feature_extractor", None), "sampling_rate", 0) or sample_rate)
        wav = _mono_at(wav, sample_rate, target)  # not the pipeline's resampler: it needs torchaudio
        if wav.size == 0:
            return ""
        kw = {"generate_kwargs": {"language": self.language}} if self.language else {}
        out = self._pipe({"raw": wav, "sampling_rate": target}, **kw)
        return str(out["text"]).strip()


# ---- WER / CER -------------------------------------------------------------------------------------------------------
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})


def normalize_text(text: str) -> str:
    """Lowercase, strip punctuation (apostrophes inside words kept: ``don't``), hyphens and slashes to spaces,
    collapse whitespace. Works on any script (Unicode punctuation categories)."""
    t = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).lower()
    t = re.sub(r"[-/]", " ", t)
    out = []
    for i, ch in enumerate(t):
        if ch == "'":
            keep = 0 < i < len(t) - 1 and t[i - 1].isalnum() and t[i + 1].isalnum()
            out.append("'" if keep else " ")
        elif unicodedata.category(ch).startswith(("P", "S")):
            out.append(" ")
        else:
            out.append(ch)
    return " ".join("".join(out).split())


def find_repetition(words: Sequence[str]) -> tuple[str, int] | None:
    """The first n-gram (n <= 4) repeated back to back at least 3 times, as ``(ngram, repeats)``, or ``None``. The
    signature of a TTS loop ("the the the the ...")."""
    n_words = len(words)
    for n in range(1, 5):
        for i in range(0, n_words - n * 3 + 1):
            gram = tuple(words[i:i + n])
            r = 1
            while tuple(words[i + r * n:i + (r + 1) * n]) == gram:
                r += 1
            if r >= 3:
                return " ".join(gram), r
    return None


@dataclass
class ErrorRates:
    """Corpus and per-utterance error rates.

    Attributes:
        unit: ``"word"`` (WER) or ``"char"`` (CER). rate: ``(S + D + I) / N`` over all utterances.
        rate_without_outliers: the same without the flagged ones. errors, ref_units: the totals behind ``rate``.
        utterances: per pair ``ref``, ``hyp`` (normalised), ``rate``, ``substitutions``, ``deletions``,
            ``insertions``, ``ref_units``, ``outlier``, ``why``. outliers: indices of flagged utterances.
    """

    unit: str
    rate: float
    rate_without_outliers: float
    errors: int
    ref_units: int
    utterances: list[dict] = field(default_factory=list)
    outliers: list[int] = field(default_factory=list)

    def summary(self) -> dict:
        name = "wer" if self.unit == "word" else "cer"
        return {name: self.rate, f"{name}_without_outliers": self.rate_without_outliers, "errors": self.errors,
                f"ref_{self.unit}s": self.ref_units, "utterances": len(self.utterances),
                "outliers": len(self.outliers)}


def _units(text: str, unit: str) -> list[str]:
    norm = normalize_text(text)
    return norm.split() if unit == "word" else list(norm.replace(" ", ""))


def error_rates(refs: Sequence[str], hyps: Sequence[str], unit: str = "word") -> ErrorRates:
    """:func:`wer` (``unit="word"``) or :func:`cer` (``"char"``). Raises ValueError: another unit, unequal lengths."""
    if unit not in ("word", "char"):
        raise ValueError(f"unit must be 'word' or 'char', got {unit!r}")
    refs, hyps = list(refs), list(hyps)
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    utts, outliers = [], []
    tot_err = tot_n = ok_err = ok_n = 0
    for i, (r, h) in enumerate(zip(refs, hyps)):
        ru, hu = _units(r, unit), _units(h, unit)
        if ru and hu:
            o = jiwer.process_words(" ".join(ru), " ".join(hu))
            s, d, ins = o.substitutions, o.deletions, o.insertions
        else:  # jiwer refuses empty strings: all deletions or all insertions
            s, d, ins = 0, len(ru), len(hu)
        err = s + d + ins
        why = ""
        rep = find_repetition(hu) if unit == "word" else None
        if rep is not None and find_repetition(ru) is None:
            why = f"repetition: {rep[0]!r} x{rep[1]}"
        elif len(hu) > 2 * max(len(ru), 1) + 2:
            why = f"hypothesis {len(hu)} {unit}s for {len(ru)} in the reference"
        utts.append({"ref": " ".join(ru) if unit == "word" else "".join(ru),
                     "hyp": " ".join(hu) if unit == "word" else "".join(hu),
                     "rate": err / len(ru) if ru else float(err > 0), "substitutions": s, "deletions": d,
                     "insertions": ins, "ref_units": len(ru), "outlier": bool(why), "why": why})
        tot_err += err
        tot_n += len(ru)
        if why:
            outliers.append(i)
        else:
            ok_err += err
            ok_n += len(ru)
    return ErrorRates(unit, tot_err / tot_n if tot_n else 0.0, ok_err / ok_n if ok_n else 0.0, tot_err, tot_n,
                      utts, outliers)


def wer(refs: Sequence[str], hyps: Sequence[str]) -> ErrorRates:
    """Word error rate (:class:`ErrorRates`) of equal-length ``hyps`` against ``refs`` after :func:`normalize_text`
    (an empty hypothesis: all deletions). Outliers: a hypothesis longer than ``2 * len(ref) + 2`` words, or a
    back-to-back repeated n-gram (:func:`find_repetition`) the reference lacks."""
    return error_rates(refs, hyps, "word")


def cer(refs: Sequence[str], hyps: Sequence[str]) -> ErrorRates:
    """Character error rate (spaces removed after normalisation): the figure for Chinese and Japanese."""
    return error_rates(refs, hyps, "char")
