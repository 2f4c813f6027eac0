"""Audio at the codec's geometry: the 12 Hz interface (24 kHz, 1920 samples = one 80 ms frame), loading and resampling;
a WAV written chunk by chunk as a stream makes it (:class:`WavWriter`).
"""

from __future__ import annotations

import io
import math
import os
import struct
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


#: Bytes of the header :class:`WavWriter` writes: RIFF, a 16-byte ``fmt`` chunk, the ``data`` chunk's header.
WAV_HEADER_BYTES = 44
#: The sizes a WAV of unknown length carries (a pipe: the header cannot be rewritten), as streaming writers do.
UNKNOWN_SIZE = 0xFFFFFFFF


class WavWriter:
    """A mono 16-bit PCM WAV written chunk by chunk (docs/streaming.md), a context manager. To a file, the samples
    go first and then the header's sizes, so the file is always a valid WAV of the chunks written, even after Ctrl-C;
    to a pipe (not seekable), the sizes are :data:`UNKNOWN_SIZE`. Float samples are clipped to [-1, 1] (a stream
    cannot scale by a peak it has not seen yet), stored as ``round(x * 32767)``.

    Args:
        target: a path (created or truncated) or a binary file object (not closed here). sample_rate: Hz.

    Attributes: ``samples`` (written so far), ``seekable`` (whether the header is rewritten).
    """

    def __init__(self, target, sample_rate: int):
        self._own = isinstance(target, (str, os.PathLike))
        self.f = open(target, "wb") if self._own else target
        try:
            self.seekable = bool(self.f.seekable())
        except (AttributeError, OSError):
            self.seekable = False
        self.sample_rate, self.samples = int(sample_rate), 0
        self.f.write(self._header(0 if self.seekable else None))
        self.f.flush()

    def _header(self, data_bytes: int | None) -> bytes:
        riff = UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
        data = UNKNOWN_SIZE if data_bytes is None else data_bytes
        return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, self.sample_rate,
                                                                            2 * self.sample_rate, 2, 16)
                + b"data" + struct.pack("<I", data))

    def write(self, audio) -> None:
        """Append ``audio`` (``(samples,)`` float, a tensor or an array) and make the file valid with it."""
        x = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0)
        self.f.write(np.round(x * 32767.0).astype("<i2").tobytes())
        self.samples += x.size
        if self.seekable:  # the samples are in; now the sizes that make them part of the file
            n = 2 * self.samples
            self.f.seek(4)
            self.f.write(struct.pack("<I", 36 + n))
            self.f.seek(40)
            self.f.write(struct.pack("<I", n))
            self.f.seek(0, os.SEEK_END)
        self.f.flush()

    def close(self) -> None:
        """Flush, and close a file this writer opened."""
        try:
            self.f.flush()
        finally:
            if self._own:
                self.f.close()

    def __enter__(self) -> "WavWriter":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
