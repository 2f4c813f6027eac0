"""Audio at the codec's geometry (24 kHz, 1920 samples = one 80 ms frame): checking, loading, resampling."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import librosa  # a lazy loader: its submodules load on first use
import numpy as np
import soundfile as sf

#: The real 12 Hz tokenizer's geometry (docs/model.md#speech-tokenizer).
SAMPLE_RATE, FRAME_RATE_HZ, FRAME_SAMPLES = 24000, 12.5, 1920


def n_frames(n_samples: int, frame_samples: int = FRAME_SAMPLES) -> int:
    """Frames that cover ``n_samples`` (the last frame zero-padded): ``ceil(n_samples / frame_samples)``."""
    return -(-int(n_samples) // int(frame_samples))


def _check_wav(wav, sample_rate: int, expected_rate: int) -> np.ndarray:
    if int(sample_rate) != int(expected_rate):
        raise ValueError(f"audio at {sample_rate} Hz, the codec needs {expected_rate} Hz: resample first, e.g. "
                         f"librosa.resample(wav, orig_sr={sample_rate}, target_sr={expected_rate})")
    wav = np.asarray(wav)
    if wav.ndim == 2 and 1 in wav.shape:
        wav = wav.reshape(-1)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio of shape (samples,), got shape {wav.shape}: average the channels "
                         "(wav.mean(axis=1)) first")
    if wav.size == 0:
        raise ValueError("empty audio: nothing to encode (check the file that was loaded)")
    if not np.issubdtype(wav.dtype, np.floating):
        raise ValueError(f"expected float audio in [-1, 1], got dtype {wav.dtype}: convert with "
                         "wav.astype(np.float32) / 32768 for 16-bit PCM")
    wav = wav.astype(np.float32, copy=False)
    if not np.all(np.isfinite(wav)):
        raise ValueError("audio contains NaN or inf samples")
    return wav


def _load_any(w, sample_rate: int) -> np.ndarray:
    """An array is taken as audio at ``sample_rate``; a path is read and resampled to it."""
    if isinstance(w, (str, os.PathLike)):
        return load_wav(w, sample_rate)
    return _check_wav(w, sample_rate, sample_rate)


def load_wav(path: str | os.PathLike, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Read an audio file as mono float32 at ``sample_rate`` (resampled with librosa if needed).

    Raises:
        FileNotFoundError: no such file.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no audio file at {p}")
    wav, sr = sf.read(str(p), dtype="float32", always_2d=True)
    wav = wav.mean(axis=1)
    if sr != sample_rate:
        wav = librosa.resample(wav, orig_sr=sr, target_sr=sample_rate).astype(np.float32)
    return wav


def resample(wav: np.ndarray, sr_from: int, sr_to: int) -> np.ndarray:
    """Polyphase resampling (``scipy.signal.resample_poly``); the input is returned when the rates agree."""
    if sr_from == sr_to:
        return wav
    from scipy.signal import resample_poly  # here, not above: importing scipy.signal takes 2 s (measured)

    g = math.gcd(int(sr_from), int(sr_to))
    return resample_poly(wav, sr_to // g, sr_from // g).astype(np.float32)


def _decode_audio(item) -> tuple[np.ndarray, int]:
    """``(samples,)`` float32 mono audio and its rate from a datasets audio cell (decoded dict, or bytes / path)."""
    if isinstance(item, dict) and item.get("array") is not None:
        wav, sr = np.asarray(item["array"], dtype=np.float32), int(item["sampling_rate"])
    elif isinstance(item, dict) and (item.get("bytes") or item.get("path")):
        src = io.BytesIO(item["bytes"]) if item.get("bytes") else item["path"]
        wav, sr = sf.read(src, dtype="float32", always_2d=False)
    else:
        raise ValueError(f"unreadable audio cell {type(item).__name__}: expected {{'array', 'sampling_rate'}} or "
                         "{'bytes'/'path'}")
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim == 2:  # (samples, channels)
        wav = wav.mean(axis=1)
    return wav, sr
