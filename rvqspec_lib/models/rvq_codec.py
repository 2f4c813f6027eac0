"""The offline speech codec with the Qwen3-TTS 12 Hz interface (24 kHz audio <-> (frames, 16) codes; ``encode``,
``decode``, ``sample_rate``, ``frame_samples``, ``n_codebooks``, ``codebook_size``), fitted here on audio rendered here.

:class:`RVQCodec`: log-mel spectra (20 ms hop) with 4 mel frames stacked into one 80 ms frame vector, quantised by
16 stages of residual k-means (fitted by :func:`recipes.embedded.codec_fit.fit_codec`); decoding sums the
centroids (or runs a neural code decoder), inverts the mel filter bank and estimates phase with Griffin-Lim. NOT a
neural codec: its deep stages carry little structure (docs/offline.md#template-sentences).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import librosa  # a lazy loader: its submodules load on first use
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rvqspec_lib.common.files import atomic_output, json_text, write_text_atomic
from rvqspec_lib.models.audio import FRAME_SAMPLES, SAMPLE_RATE, _check_wav, n_frames
from rvqspec_lib.models.code_decoder import CodeDecoder


@dataclass(frozen=True)
class CodecConfig:
    """Geometry of an :class:`RVQCodec`; defaults match the real 12 Hz tokenizer's frame layout.

    Attributes:
        sample_rate: Hz. frame_samples: per code frame (1920 = 80 ms). hop_samples: mel hop (480 = 20 ms; a
            multiple stacks per frame). n_fft: 2048, just above the window. win_samples: 80 ms, long enough for the
            harmonics of low voices. n_mels: 80. fmax_hz: top of the mel filter bank. log_floor: under the mel power
            before the log (silence, not -inf). n_codebooks, codebook_size: residual stages and their entries.
        griffin_lim_iters: phase-estimation iterations at decode (more costs time for little intelligibility).
        mel_inverse: ``"mu"`` or ``"librosa"`` (:meth:`RVQCodec.mel_to_magnitude`); mel_inverse_iters: ``"mu"``'s.
        seed: of k-means and of Griffin-Lim's initial phase (decode is deterministic).

    Raises:
        ValueError: a frame that is not whole mel hops, an unknown ``mel_inverse``, no stage or a 1-entry codebook.
    """

    sample_rate: int = SAMPLE_RATE
    frame_samples: int = FRAME_SAMPLES
    hop_samples: int = 480
    n_fft: int = 2048
    win_samples: int = 1920
    n_mels: int = 80
    fmax_hz: float = SAMPLE_RATE / 2
    log_floor: float = 1e-5
    n_codebooks: int = 16
    codebook_size: int = 2048
    griffin_lim_iters: int = 32
    mel_inverse: str = "mu"
    mel_inverse_iters: int = 50
    seed: int = 0

    def __post_init__(self):
        if self.frame_samples % self.hop_samples:
            raise ValueError(f"frame_samples ({self.frame_samples}) must be a multiple of hop_samples "
                             f"({self.hop_samples}) so that whole mel frames stack into one code frame")
        if self.mel_inverse not in ("mu", "librosa"):
            raise ValueError(f"mel_inverse must be 'mu' or 'librosa', got {self.mel_inverse!r}")
        if self.n_codebooks < 1 or self.codebook_size < 2:
            raise ValueError(f"need n_codebooks >= 1 and codebook_size >= 2, got {self.n_codebooks}, "
                             f"{self.codebook_size}")

    @property
    def stack(self) -> int:
        """Mel frames per code frame (4)."""
        return self.frame_samples // self.hop_samples

    @property
    def dim(self) -> int:
        """Length of one frame vector: ``stack * n_mels`` (320)."""
        return self.stack * self.n_mels

    @property
    def frame_rate_hz(self) -> float:
        return self.sample_rate / self.frame_samples


def _check_codes(codes, n_codebooks: int, codebook_size: int) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] != n_codebooks:
        raise ValueError(f"codes must have shape (frames, {n_codebooks}), got {codes.shape}: pass one row per frame "
                         f"with all {n_codebooks} codebooks (decode(codes, n_codebooks=k) uses only the first k and "
                         "ignores the other columns: pad them with 0)")
    if codes.size and not np.issubdtype(codes.dtype, np.integer):
        raise ValueError(f"codes must be integers, got dtype {codes.dtype}")
    if codes.size and (codes.min() < 0 or codes.max() >= codebook_size):
        raise ValueError(f"code ids must lie in [0, {codebook_size}), got range [{codes.min()}, {codes.max()}]: "
                         "special ids (pad, bos, eos >= 2048) must be stripped before decoding")
    return codes.astype(np.int64, copy=False)


def nearest(x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid of each row: ``x`` `(n, dim)` and ``c`` `(k, dim)` float32 -> ``(index (n,) int64, squared
    distance (n,) float32)``."""
    c_sq, chunk = (c * c).sum(1), 8192
    idx = torch.empty(x.shape[0], dtype=torch.long)
    dist = torch.empty(x.shape[0], dtype=torch.float32)
    for i in range(0, x.shape[0], chunk):  # chunks keep the (chunk, k) distance matrix small
        xb = x[i:i + chunk]
        d = c_sq[None, :] - 2.0 * (xb @ c.T)  # squared distances less |x|^2, a per-row constant: same argmin
        m, j = d.min(1)
        idx[i:i + chunk] = j
        dist[i:i + chunk] = (m + (xb * xb).sum(1)).clamp_min(0)
    return idx, dist


class RVQCodec:
    """Residual k-means over stacked log-mel frames; Griffin-Lim back to audio (module docstring).

    Attributes:
        config: the :class:`CodecConfig`.
        codebooks: `(n_codebooks, codebook_size, dim)` float32 tensor, stage-major.
    """

    def __init__(self, config: CodecConfig, codebooks: torch.Tensor, code_decoder=None):
        expect = (config.n_codebooks, config.codebook_size, config.dim)
        if tuple(codebooks.shape) != expect:
            raise ValueError(f"codebooks of shape {tuple(codebooks.shape)} do not match the config {expect}")
        self.config = config
        self.codebooks = codebooks.to(torch.float32).contiguous()
        self.code_decoder = code_decoder
        self._mel_basis = None

    @property
    def decoder_kind(self) -> str:
        """``"neural"`` when a :class:`~rvqspec_lib.models.code_decoder.CodeDecoder` turns codes into frame vectors,
        ``"table"`` when the selected centroids are summed (:meth:`dequantize`)."""
        return "table" if self.code_decoder is None else "neural"

    def with_decoder(self, code_decoder=None) -> "RVQCodec":
        """The same codec (shared tables) decoding with ``code_decoder`` (``None``: the table decoder)."""
        return RVQCodec(self.config, self.codebooks, code_decoder)

    def decode_vectors(self, codes, n_codebooks: int | None = None) -> np.ndarray:
        """Codes `(frames, n_codebooks)` -> frame vectors `(frames, dim)` float32 by this codec's decoder
        (:attr:`decoder_kind`): the neural code decoder when one is attached, else :meth:`dequantize`."""
        if self.code_decoder is None:
            return self.dequantize(codes, n_codebooks)
        codes = _check_codes(codes, self.config.n_codebooks, self.config.codebook_size)
        k = self._check_k(n_codebooks)
        if codes.shape[0] == 0:
            return np.zeros((0, self.config.dim), dtype=np.float32)
        return self.code_decoder.vectors(codes, k)

    # interface shared with Qwen12HzCodec
    sample_rate = property(lambda self: self.config.sample_rate)
    frame_samples = property(lambda self: self.config.frame_samples)
    n_codebooks = property(lambda self: self.config.n_codebooks)
    codebook_size = property(lambda self: self.config.codebook_size)
    frame_rate_hz = property(lambda self: self.config.frame_rate_hz)

    # ---------------------------------------------------------------- features
    @staticmethod
    def features_for(wav: np.ndarray, config: CodecConfig) -> np.ndarray:
        """Stacked log-mel frame vectors of checked `(samples,)` float32 audio: `(frames, dim)` float32,
        ``frames = ceil(samples / frame_samples)``, the last frame zero-padded."""
        c = config
        f = n_frames(wav.shape[0], c.frame_samples)
        y = np.zeros(f * c.frame_samples, dtype=np.float32)
        y[: wav.shape[0]] = wav
        with warnings.catch_warnings():  # one frame is shorter than n_fft: librosa pads, and says so
            warnings.filterwarnings("ignore", message="n_fft=.*is too large")
            mel = librosa.feature.melspectrogram(y=y, sr=c.sample_rate, n_fft=c.n_fft, hop_length=c.hop_samples,
                                                 win_length=c.win_samples, n_mels=c.n_mels, fmax=c.fmax_hz,
                                                 power=2.0, center=True)  # (n_mels, stack * f + 1)
        logmel = np.log(np.maximum(mel[:, : f * c.stack], c.log_floor))  # (n_mels, stack * f)
        return np.ascontiguousarray(logmel.T.reshape(f, c.dim), dtype=np.float32)  # (f, stack * n_mels)

    def features(self, wav: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """`(frames, dim)` float32 frame vectors of ``wav`` (see :meth:`features_for`)."""
        return self.features_for(_check_wav(wav, sample_rate, self.config.sample_rate), self.config)

    # ---------------------------------------------------------------- encode / decode
    def quantize(self, vectors: np.ndarray) -> np.ndarray:
        """Greedy residual quantisation: `(frames, dim)` float32 -> `(frames, n_codebooks)` int64 codes."""
        r = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).clone()
        codes = torch.empty(r.shape[0], self.config.n_codebooks, dtype=torch.long)
        for s in range(self.config.n_codebooks):
            idx, _ = nearest(r, self.codebooks[s])
            codes[:, s] = idx
            r -= self.codebooks[s][idx]
        return codes.numpy()

    def dequantize(self, codes, n_codebooks: int | None = None) -> np.ndarray:
        """Sum of the selected centroids of the first ``n_codebooks`` stages -> `(frames, dim)` float32."""
        codes = _check_codes(codes, self.config.n_codebooks, self.config.codebook_size)
        k = self._check_k(n_codebooks)
        ct = torch.from_numpy(codes)
        v = torch.zeros(codes.shape[0], self.config.dim)
        for s in range(k):
            v += self.codebooks[s][ct[:, s]]
        return v.numpy()

    def encode(self, wav: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """`(samples,)` float audio in [-1, 1] -> `(frames, n_codebooks)` int64, ``frames = ceil(samples / 1920)``.

        Raises:
            ValueError: bad audio, a ``sample_rate`` other than the codec's (resample first).
        """
        return self.quantize(self.features(wav, sample_rate))

    def decode(self, codes, n_codebooks: int | None = None) -> np.ndarray:
        """`(frames, n_codebooks)` integer codes in ``[0, codebook_size)`` -> `(frames * frame_samples,)` float32 audio,
        through :meth:`decode_vectors`; ``n_codebooks``: the first k stages only (coarser audio)."""
        return self.vectors_to_audio(self.decode_vectors(codes, n_codebooks))

    def vectors_to_audio(self, vectors: np.ndarray) -> np.ndarray:
        """Frame vectors `(frames, dim)` -> mel -> linear magnitude -> Griffin-Lim -> `(frames * 1920,)` float32."""
        c = self.config
        f = vectors.shape[0]
        if f == 0:
            return np.zeros(0, dtype=np.float32)
        mel = np.exp(vectors.reshape(f * c.stack, c.n_mels).T)  # (n_mels, stack * f) mel power
        mag = self.mel_to_magnitude(mel)  # (1 + n_fft/2, stack * f)
        mag = np.concatenate([mag, mag[:, -1:]], 1)  # (1 + n_fft/2, stack * f + 1): the centred STFT of f frames
        with warnings.catch_warnings():  # one frame (1920 samples) is shorter than n_fft: librosa pads, and says so
            warnings.filterwarnings("ignore", message="n_fft=.*is too large")
            wav = librosa.griffinlim(mag, n_iter=c.griffin_lim_iters, hop_length=c.hop_samples,
                                     win_length=c.win_samples, n_fft=c.n_fft, center=True,
                                     length=f * c.frame_samples, random_state=c.seed)
        return wav.astype(np.float32)

    def mel_to_magnitude(self, mel: np.ndarray) -> np.ndarray:
        """Non-negative least-squares inverse of the mel filter bank: mel power `(n_mels, t)` -> magnitude
        `(1 + n_fft/2, t)` float32. ``"librosa"``: ``librosa.feature.inverse.mel_to_stft`` (L-BFGS-B, slow);
        ``"mu"``: the same ``min_S |B S - M|^2, S >= 0`` by Lee-Seung multiplicative updates from the clipped
        pseudo-inverse, many times faster and no less accurate on speech."""
        c = self.config
        if c.mel_inverse == "librosa":
            return librosa.feature.inverse.mel_to_stft(mel, sr=c.sample_rate, n_fft=c.n_fft, power=2.0,
                                                       fmax=c.fmax_hz).astype(np.float32)
        if self._mel_basis is None:
            b = torch.from_numpy(librosa.filters.mel(sr=c.sample_rate, n_fft=c.n_fft, n_mels=c.n_mels,
                                                     fmax=c.fmax_hz)).float()  # (n_mels, 1 + n_fft/2)
            self._mel_basis = (b, torch.linalg.pinv(b))
        b, b_pinv = self._mel_basis
        m = torch.from_numpy(np.ascontiguousarray(mel, dtype=np.float32))
        s = (b_pinv @ m).clamp_min(1e-12)  # (1 + n_fft/2, t) power spectrum
        bt_m = b.T @ m
        for _ in range(c.mel_inverse_iters):
            # the 1e-12 floor keeps values out of the denormal range (100x slower arithmetic)
            s = (s * bt_m / (b.T @ (b @ s)).clamp_min(1e-30)).clamp_min(1e-12)
        return s.sqrt().numpy()

    def _check_k(self, n_codebooks):
        if n_codebooks is None:
            return self.config.n_codebooks
        if not (1 <= int(n_codebooks) <= self.config.n_codebooks):
            raise ValueError(f"n_codebooks must be in [1, {self.config.n_codebooks}], got {n_codebooks}")
        return int(n_codebooks)

    # ---------------------------------------------------------------- files
    def save(self, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
        """Write ``<path>`` (safetensors: ``codebooks``, the config in its metadata) and ``<path>.json``, each
        atomically; ``path`` may be a folder (``<folder>/codec.safetensors``); ``dtype``: the codebooks' on disk
        (:meth:`load` returns float32). Returns the safetensors path."""
        p = _codec_file(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        cfg_json = json_text(asdict(self.config))
        with atomic_output(p) as tmp:
            save_file({"codebooks": self.codebooks.to(dtype).contiguous()}, str(tmp),
                      metadata={"config": cfg_json, "format": "rvqspec-rvq-codec"})
        write_text_atomic(p.with_suffix(".json"), cfg_json + "\n")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike, decoder: str | os.PathLike | None = "auto") -> "RVQCodec":
        """Read a codec written by :meth:`save` (a ``.safetensors`` file or the folder holding ``codec.safetensors``).

        Args:
            decoder: ``"auto"`` attaches the neural code decoder beside the codec (:func:`decoder_file`) when there
                is one; ``"neural"`` requires it; ``"table"`` or ``None`` never attaches one; a ``.safetensors`` path
                attaches that file.

        Raises:
            FileNotFoundError: no codec file, or no decoder file where one is required.
            ValueError: an unknown ``decoder`` word, a decoder file that is not one or fits other codebooks.
        """
        p = _codec_file(path)
        if not p.is_file():
            raise FileNotFoundError(f"no codec file at {p}: fit one with "
                                    f"recipes.embedded.codec_fit.fit_codec(wavs).save({str(p)!r}) "
                                    "(scripts/measure_codec.py does this on a rendered corpus)")
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            books = f.get_tensor("codebooks")
        side = p.with_suffix(".json")
        raw = json.loads(side.read_text()) if side.is_file() else json.loads(meta.get("config", "{}"))
        known = {fl.name for fl in fields(CodecConfig)}
        codec = cls(CodecConfig(**{k: v for k, v in raw.items() if k in known}), books)
        if decoder is None or decoder == "table":
            return codec
        if decoder in ("auto", "neural"):
            dec_path = decoder_file(p)
        elif isinstance(decoder, (str, os.PathLike)) and Path(decoder).suffix == ".safetensors":
            dec_path = Path(decoder).expanduser()
        else:
            raise ValueError(f"decoder must be 'auto', 'neural', 'table' or a .safetensors file, got {decoder!r}")
        if decoder != "auto" and not dec_path.is_file():
            raise FileNotFoundError(f"no code decoder at {dec_path}: pass decoder='auto' (the one beside the codec, "
                                    "if any) or 'table' (sum of centroids), or train one (`make embedded`, stage "
                                    "'decoder')")
        if dec_path.is_file():
            codec.code_decoder = CodeDecoder.load(dec_path, codec.codebooks)
        return codec


def decoder_file(codec_path) -> Path:
    """Where :meth:`RVQCodec.load` looks for a codec's neural code decoder: ``<stem>.decoder.safetensors``."""
    p = _codec_file(codec_path)
    return p.with_name(p.stem + ".decoder.safetensors")


def _codec_file(path) -> Path:
    """A codec's file: ``path`` itself (a ``.safetensors``), or ``<path>/codec.safetensors`` for a folder."""
    p = Path(path).expanduser()
    return p / "codec.safetensors" if p.suffix != ".safetensors" else p
