"""Stage 1 of a stand-in that speaks (docs/model.md#a-learned-codec): a codec learned end to end on the corpus the
embedded model uses, with the real 12 Hz tokenizer's interface (24 kHz audio <-> ``(frames, 16)`` codes), measured
by :mod:`recipes.embedded.codec_probe` before anything is trained on its codes.

    nice python -m recipes.embedded.learned_codec data  --sentences 4000 --out build/learned_codec
    nice python -m recipes.embedded.learned_codec train --work build/learned_codec --minutes 35 --rate-weight 0.005
    nice python -m recipes.embedded.codec_probe --codec build/learned_codec/codec.safetensors --json OUT.json

What it is (:class:`LearnedCodec`):

- **Features**: the shipped codec's stacked log-mel frame vectors (:meth:`RVQCodec.features_for`: 80 mels, 20 ms hop,
  4 per 80 ms frame) of the utterance scaled to a root mean square of 1 (so a change of gain changes nothing, up to
  float rounding), standardised per dimension on the training frames.
- **Encoder** and **decoder**: small convolutional networks over the frame axis (kernel 3, two hidden layers, so
  each frame's latent sees 2 frames either side); the latent is ``latent_dim`` numbers per frame, scaled to a root
  mean square of 1. With ``transform="none"`` neither exists: the quantiser learns on the standardised features
  themselves and decoding is the shipped codec's path, which isolates the quantiser from the learned decoder.
- **Residual vector quantiser** of 16 stages, trained with the codec: codebooks by exponential moving averages of
  the residuals assigned to them (van den Oord et al. 2017, appendix), unused entries restarted on residuals of the
  batch (Dhariwal et al. 2020), the straight-through gradient and a commitment loss; **quantiser dropout**
  (Zeghidour et al. 2021, SoundStream): half of the training windows use only the first k stages, k uniform, so
  the early stages carry the most.
- **Entropy-constrained choice** (Chou, Lookabaugh & Gray 1989): each stage picks the entry minimising the squared
  error plus ``rate_weight`` times the entry's code length in bits (``-log2`` of its smoothed usage), in training
  and at encoding. Where the residual is large (early stages) the error decides; where it is as small as what the
  decoder can tell apart (deep stages) the common entries win, so a deep code changes only when the sound does.
  ``rate_weight = 0`` is plain nearest-neighbour RVQ (the negative control).
- **Fewer deep entries** (``deep_codebook_size``): the stages after the first may choose from their first entries
  only, which spreads a frame's detail over more stages of fewer bits each; the vocabulary stays 2048.
- **Beam search at encoding** (``encode_beam``): the 16 codes of a frame chosen jointly, keeping the ``encode_beam``
  best partial choices (squared error plus the rate term) from stage to stage, instead of each stage's best given the
  stages before (``encode_beam = 1``, as in training). The codebooks and the decoder do not change; only which codes a
  frame gets.
- **Audio**: the decoder's log-mel frames through the shipped codec's mel inversion and Griffin-Lim
  (:meth:`RVQCodec.vectors_to_audio`), at the training corpus's median loudness. A neural vocoder does not fit two
  CPU cores in a working session; Griffin-Lim is what the shipped codec uses, so the two compare on the same last step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

from rvqspec_lib.common.files import atomic_output, json_text
from rvqspec_lib.common.machine import cpu_model
from rvqspec_lib.models.audio import SAMPLE_RATE, _check_wav
from rvqspec_lib.models.rvq_codec import CodecConfig, RVQCodec

#: The ``format`` a learned codec's safetensors metadata carries (the shipped codec's is ``rvqspec-rvq-codec``).
FORMAT = "rvqspec-learned-codec"


@dataclass(frozen=True)
class LearnedCodecConfig:
    """Sizes of a :class:`LearnedCodec` (the frame layout is :class:`CodecConfig`'s: 80 ms frames of 4 x 80 mels).

    Attributes:
        n_codebooks, codebook_size: residual stages and entries per stage (the talker's vocabulary: 16 x 2048).
        latent_dim: numbers per frame between encoder and decoder. hidden: channels of the hidden layers.
        transform: ``"conv"`` (learned encoder and decoder) or ``"none"``: the quantiser works on the standardised
            features themselves and the decoder is the identity (``latent_dim`` must then be the feature size, 320),
            which keeps the shipped codec's reconstruction path and changes only how entries are learned and chosen.
        deep_codebook_size: entries the stages after the first choose from (the first ``deep_codebook_size`` of each
            codebook; the rest are never used, so the talker's vocabulary stays ``codebook_size``); 0: all of them.
            Fewer entries spread a frame's detail over more stages, each carrying fewer bits.
        rate_weight: lambda of the entropy-constrained choice, in squared latent units per bit (0: nearest entry).
        encode_beam: partial code sequences kept per frame when encoding (1: each stage greedily; training is greedy).
        usage_smoothing: pseudo-count added to every entry's usage before its code length is taken.
        ema_decay: of the codebooks' moving averages. dead_usage: an entry whose moving-average usage per batch falls
            below this is restarted on a residual of the batch.
    """

    n_codebooks: int = 16
    codebook_size: int = 2048
    latent_dim: int = 32
    hidden: int = 256
    transform: str = "conv"
    deep_codebook_size: int = 0
    rate_weight: float = 0.005
    usage_smoothing: float = 1.0
    ema_decay: float = 0.99
    dead_usage: float = 0.01
    encode_beam: int = 1

    def __post_init__(self):
        if self.n_codebooks < 1 or self.codebook_size < 2 or self.latent_dim < 1 or self.hidden < 1:
            raise ValueError(f"need n_codebooks >= 1, codebook_size >= 2, latent_dim and hidden >= 1: {self}")
        if self.transform not in ("conv", "none"):
            raise ValueError(f"transform must be 'conv' or 'none', got {self.transform!r}")
        if not 0 <= self.deep_codebook_size <= self.codebook_size or self.deep_codebook_size == 1:
            raise ValueError(f"deep_codebook_size must be 0 (all entries) or in [2, {self.codebook_size}], got "
                             f"{self.deep_codebook_size}")
        if self.encode_beam < 1:
            raise ValueError(f"encode_beam must be >= 1 (1: greedy), got {self.encode_beam}")
        if self.rate_weight < 0 or not 0 < self.ema_decay < 1:
            raise ValueError(f"need rate_weight >= 0 and 0 < ema_decay < 1, got {self.rate_weight}, "
                             f"{self.ema_decay}")


def _net(c_in: int, hidden: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv1d(c_in, hidden, 3, padding=1), nn.GELU(), nn.Conv1d(hidden, hidden, 3, padding=1),
                         nn.GELU(), nn.Conv1d(hidden, c_out, 1))


class ResidualQuantizer(nn.Module):
    """16 stages of entropy-constrained residual vector quantisation with moving-average codebooks (module
    docstring). Buffers: ``codebooks`` `(n_q, K, D)`, ``usage`` `(n_q, K)` (moving-average assignments per batch),
    ``sums`` `(n_q, K, D)` (moving-average sums of the assigned residuals), ``ready`` (codebooks initialised)."""

    def __init__(self, cfg: LearnedCodecConfig):
        super().__init__()
        self.cfg = cfg
        q, k, d = cfg.n_codebooks, cfg.codebook_size, cfg.latent_dim
        self.register_buffer("codebooks", torch.zeros(q, k, d))
        self.register_buffer("usage", torch.ones(q, k))
        self.register_buffer("sums", torch.zeros(q, k, d))
        self.register_buffer("ready", torch.zeros((), dtype=torch.bool))

    def size(self, stage: int) -> int:
        """Entries ``stage`` chooses from (its first ones): ``codebook_size`` at stage 0, ``deep_codebook_size``
        (when set) after it."""
        return self.cfg.deep_codebook_size if stage and self.cfg.deep_codebook_size else self.cfg.codebook_size

    def code_lengths(self, stage: int) -> torch.Tensor:
        """`(size(stage),)` float32 bits of each entry of ``stage`` under its smoothed usage."""
        u = self.usage[stage, :self.size(stage)] + self.cfg.usage_smoothing
        return -torch.log2(u / u.sum())

    def rates(self, stage: int) -> torch.Tensor:
        """`(size(stage),)` rate_weight x each entry's bits (zeros at rate_weight 0)."""
        if self.cfg.rate_weight > 0:
            return self.cfg.rate_weight * self.code_lengths(stage)
        return torch.zeros(self.size(stage))

    def costs(self, r: torch.Tensor, stage: int, rates: torch.Tensor | None = None) -> torch.Tensor:
        """`(..., size(stage))` squared error of each entry of ``stage`` against ``r`` `(..., D)` plus its rate term
        (``rates``: :meth:`rates` of the stage, when already computed)."""
        c = self.codebooks[stage, :self.size(stage)]
        cost = (r * r).sum(-1, keepdim=True) - 2 * r @ c.T + (c * c).sum(1)
        if self.cfg.rate_weight > 0:
            cost = cost + (self.rates(stage) if rates is None else rates)
        return cost

    def choose(self, r: torch.Tensor, stage: int) -> torch.Tensor:
        """The entry each row of ``r`` `(N, D)` takes at ``stage``: argmin of squared error + rate_weight x bits."""
        return self.costs(r, stage).argmin(1)

    def encode(self, z: torch.Tensor, beam: int | None = None) -> torch.Tensor:
        """`(N, D)` float32 latents -> `(N, n_q)` int64 codes: greedily (``beam`` 1) or by beam search over the
        stages, keeping the ``beam`` partial choices of least squared error plus rate term (default: the config's
        ``encode_beam``)."""
        beam = self.cfg.encode_beam if beam is None else int(beam)
        if beam < 1:
            raise ValueError(f"beam must be >= 1 (1: greedy), got {beam}")
        if beam == 1:
            r, out = z.clone(), []
            for s in range(self.cfg.n_codebooks):
                idx = self.choose(r, s)
                out.append(idx)
                r = r - self.codebooks[s][idx]
            return torch.stack(out, 1)
        n, d = z.shape
        r = z[:, None, :].clone()  # (N, b, D) residual of each kept partial choice
        rate = torch.zeros(n, 1)  # (N, b) rate terms so far
        codes = torch.zeros(n, 1, 0, dtype=torch.long)
        for s in range(self.cfg.n_codebooks):
            k, bits = self.size(s), self.rates(s)
            cost = self.costs(r, s, bits) + rate[..., None]  # (N, b, k): error after this stage + all rate terms
            top = cost.reshape(n, -1).topk(min(beam, cost.shape[1] * k), dim=1, largest=False).indices
            keep, idx = top // k, top % k  # (N, beam): which partial choice, which entry
            r = torch.gather(r, 1, keep[..., None].expand(-1, -1, d)) - self.codebooks[s][idx]
            rate = torch.gather(rate, 1, keep) + bits[idx]
            codes = torch.cat([torch.gather(codes, 1, keep[..., None].expand(-1, -1, s)), idx[..., None]], -1)
        return codes[:, 0]  # topk sorts ascending: the first is the best

    def decode(self, codes: torch.Tensor, n_stages: int | None = None) -> torch.Tensor:
        """`(N, n_q)` codes -> `(N, D)` sum of the first ``n_stages`` stages' entries."""
        k = self.cfg.n_codebooks if n_stages is None else n_stages
        return sum(self.codebooks[s][codes[:, s]] for s in range(k))

    @torch.no_grad()
    def _init(self, z: torch.Tensor, gen: torch.Generator):
        r = z.clone()
        for s in range(self.cfg.n_codebooks):
            k = self.size(s)
            pick = torch.randint(r.shape[0], (k,), generator=gen)
            self.codebooks[s, :k] = r[pick] + 1e-3 * torch.randn(k, r.shape[1], generator=gen)
            self.sums[s] = self.codebooks[s].clone()
            self.usage[s, k:] = 0.0
            r = r - self.codebooks[s][self.choose(r, s)]  # usage still uniform: the rate term adds one constant
        self.ready.fill_(True)

    def forward(self, z: torch.Tensor, active: torch.Tensor, gen: torch.Generator | None = None):
        """Training pass: ``z`` `(N, D)`, ``active`` `(N,)` int stages each row uses (quantiser dropout) ->
        ``(quantised (N, D), codes (N, n_q))``; updates the moving averages when training."""
        if self.training and not bool(self.ready):
            self._init(z.detach(), gen)
        r, q_sum, codes = z.detach().clone(), torch.zeros_like(z), []
        decay = self.cfg.ema_decay
        for s in range(self.cfg.n_codebooks):
            idx = self.choose(r, s)
            codes.append(idx)
            use = (active > s).to(z.dtype)[:, None]
            q = self.codebooks[s][idx]
            if self.training:
                with torch.no_grad():
                    w = use[:, 0] * (1 - decay)  # each row's weight in the moving averages
                    self.usage[s].mul_(decay).index_add_(0, idx, w)
                    self.sums[s].mul_(decay).index_add_(0, idx, r * w[:, None])
                    n = self.usage[s].sum()
                    count = (self.usage[s] + 1e-5) / (n + self.cfg.codebook_size * 1e-5) * n
                    self.codebooks[s] = self.sums[s] / count[:, None]
                    dead = (self.usage[s, :self.size(s)] < self.cfg.dead_usage).nonzero().flatten()
                    live = (use[:, 0] > 0).nonzero().flatten()
                    if len(dead) and len(live):
                        pick = live[torch.randint(len(live), (len(dead),), generator=gen)]
                        self.codebooks[s, dead] = r[pick]
                        self.sums[s, dead] = r[pick]
                        self.usage[s, dead] = 1.0
            q_sum = q_sum + q * use
            r = r - q * use
        return q_sum, torch.stack(codes, 1)


class LearnedCodec(nn.Module):
    """Encoder, residual quantiser and decoder (module docstring), with the 12 Hz tokenizer's interface.

    Attributes:
        config: :class:`LearnedCodecConfig`. frames: :class:`CodecConfig` (the frame layout and the audio step).
        mean, std: `(dim,)` float32 buffers standardising the features; rms: the root mean square (a scalar) the
        decoded audio is scaled to.
    """

    def __init__(self, config: LearnedCodecConfig | None = None, frames: CodecConfig | None = None):
        super().__init__()
        self.config = config or LearnedCodecConfig()
        self.frames = frames or CodecConfig(n_codebooks=self.config.n_codebooks,
                                            codebook_size=self.config.codebook_size)
        dim, c = self.frames.dim, self.config
        if c.transform == "none" and c.latent_dim != dim:
            raise ValueError(f"transform 'none' quantises the features themselves: pass latent_dim={dim}")
        self.encoder = _net(dim, c.hidden, c.latent_dim) if c.transform == "conv" else nn.Identity()
        self.decoder = _net(c.latent_dim, c.hidden, dim) if c.transform == "conv" else nn.Identity()
        self.quantizer = ResidualQuantizer(c)
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))
        self.register_buffer("rms", torch.ones(()))
        self._audio = RVQCodec(self.frames, torch.zeros(self.frames.n_codebooks, self.frames.codebook_size,
                                                       self.frames.dim))

    # interface shared with RVQCodec and Qwen12HzCodec
    sample_rate = property(lambda self: self.frames.sample_rate)
    frame_samples = property(lambda self: self.frames.frame_samples)
    n_codebooks = property(lambda self: self.config.n_codebooks)
    codebook_size = property(lambda self: self.config.codebook_size)
    frame_rate_hz = property(lambda self: self.frames.frame_rate_hz)
    decoder_kind = property(lambda self: "learned" if self.config.transform == "conv" else "no learned")

    def features(self, wav: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """`(samples,)` float audio -> `(frames, dim)` float32 log-mel frame vectors of it at unit loudness
        (:func:`unit_loudness`)."""
        return RVQCodec.features_for(unit_loudness(_check_wav(wav, sample_rate, self.frames.sample_rate)), self.frames)

    def latents(self, feats: torch.Tensor) -> torch.Tensor:
        """`(B, frames, dim)` features -> `(B, frames, latent_dim)` latents, each frame's scaled to a root mean
        square of 1 (so neither the rate term nor the consistency loss can be traded against the latent's scale);
        with ``transform="none"`` the standardised features themselves."""
        x = (feats - self.mean) / self.std
        if self.config.transform == "none":
            return x
        z = self.encoder(x.transpose(1, 2)).transpose(1, 2)
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)

    def reconstruct(self, latents: torch.Tensor) -> torch.Tensor:
        """`(B, frames, latent_dim)` -> `(B, frames, dim)` standardised features."""
        return self.decoder(latents.transpose(1, 2)).transpose(1, 2)

    @torch.no_grad()
    def encode(self, wav: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """`(samples,)` float audio in [-1, 1] -> `(frames, n_codebooks)` int64, ``frames = ceil(samples / 1920)``.

        Raises:
            ValueError: bad audio, a ``sample_rate`` other than the codec's (resample first).
        """
        return self.codes_of_features(torch.from_numpy(self.features(wav, sample_rate))).numpy()

    @torch.no_grad()
    def codes_of_features(self, feats: torch.Tensor) -> torch.Tensor:
        """`(frames, dim)` features (:meth:`features`; float16 as stored by :func:`prepare_data` is fine) ->
        `(frames, n_codebooks)` int64 codes."""
        if feats.shape[0] == 0:
            return torch.zeros((0, self.n_codebooks), dtype=torch.long)
        return self.quantizer.encode(self.latents(feats.float()[None])[0])

    @torch.no_grad()
    def decode_vectors(self, codes, n_codebooks: int | None = None) -> np.ndarray:
        """`(frames, n_codebooks)` codes -> `(frames, dim)` float32 log-mel frame vectors (unit loudness)."""
        c = torch.as_tensor(np.asarray(codes), dtype=torch.long)
        bad = c.numel() and (c.min() < 0 or c.max() >= self.codebook_size)
        if n_codebooks is not None and not 1 <= int(n_codebooks) <= self.n_codebooks:
            raise ValueError(f"n_codebooks must be in [1, {self.n_codebooks}], got {n_codebooks}")
        if c.ndim != 2 or c.shape[1] != self.n_codebooks or bad:
            raise ValueError(f"codes must be (frames, {self.n_codebooks}) integers in [0, {self.codebook_size}), got "
                             f"shape {tuple(c.shape)}")
        if c.shape[0] == 0:
            return np.zeros((0, self.frames.dim), np.float32)
        y = self.reconstruct(self.quantizer.decode(c, n_codebooks)[None])[0]
        return (y * self.std + self.mean).numpy()

    def decode(self, codes, n_codebooks: int | None = None) -> np.ndarray:
        """`(frames, n_codebooks)` codes -> `(frames * 1920,)` float32 audio (mel inversion and Griffin-Lim)."""
        return self._audio.vectors_to_audio(self.decode_vectors(codes, n_codebooks)) * float(self.rms)

    def with_encode_beam(self, beam: int) -> "LearnedCodec":
        """This codec encoding with ``beam`` partial choices per frame (:class:`LearnedCodecConfig`
        ``encode_beam``; the codebooks and decoder unchanged). Returns self. ValueError: ``beam < 1``."""
        self.config = self.quantizer.cfg = replace(self.config, encode_beam=int(beam))
        return self

    # ---------------------------------------------------------------- files
    def save(self, path: str | os.PathLike, info: dict | None = None) -> Path:
        """Write the weights and both configs to ``path`` (safetensors, atomically). Returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT, "config": json_text(asdict(self.config)), "frames": json_text(asdict(self.frames)),
                "info": json_text(info or {})}
        with atomic_output(p) as tmp:
            save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(tmp), metadata=meta)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LearnedCodec":
        """Read a codec written by :meth:`save`. Raises FileNotFoundError; ValueError: not a learned codec's file."""
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"no learned codec at {p}: train one with `python -m "
                                    "recipes.embedded.learned_codec train --work DIR`")
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"{p} is not a learned codec (format {meta.get('format')!r})")
            state = {k: f.get_tensor(k) for k in f.keys()}
        cfg = LearnedCodecConfig(**json.loads(meta["config"]))
        known = {fl.name for fl in fields(CodecConfig)}
        frames = CodecConfig(**{k: v for k, v in json.loads(meta["frames"]).items() if k in known})
        codec = cls(cfg, frames)
        codec.load_state_dict(state)
        return codec.eval()


def is_learned_codec(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file :meth:`LearnedCodec.save` wrote."""
    p = Path(path).expanduser()
    if not (p.is_file() and p.suffix == ".safetensors"):
        return False
    with safe_open(str(p), framework="pt") as f:
        return (f.metadata() or {}).get("format") == FORMAT


# ---------------------------------------------------------------- data
def unit_loudness(wav: np.ndarray) -> np.ndarray:
    """``wav`` scaled to a root mean square of 1 (silence unchanged): what the encoder hears, so that a change of
    gain gives the same features."""
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64)))) if wav.size else 0.0
    return (wav / rms).astype(np.float32) if rms > 0 else wav


def _delayed(wav: np.ndarray, samples: int) -> np.ndarray:
    return np.concatenate([np.zeros(samples, np.float32), wav[:-samples]]).astype(np.float32)


def voice_set(data: dict) -> list[str]:
    """The flite voices a data file (:func:`prepare_data`) was spoken with (files from before voices were recorded:
    ``["slt"]``, the only one used then)."""
    return list(data.get("voice_set", ["slt"]))


def prepare_data(texts: Sequence[str], out: str | os.PathLike, voice: str | Sequence[str] = "slt",
                 progress: bool = True, flat_pitch: bool = False) -> Path:
    """Speak ``texts`` with flite (keeping its phone timing; ``flat_pitch``: with no intonation,
    :data:`recipes.embedded.phones.FLAT_PITCH`), each sentence with one ``voice`` (a name, several, or a
    comma-separated string: chosen per sentence as the embedded corpus chooses, :func:`voices.voice_of`), and store
    each utterance's feature frames, those of the same audio one sample later, its per-frame phones and positions and
    its voice in ``<out>/data.pt`` (with ``flat_pitch`` and the voices recorded). Resumes from
    ``<out>/data.partial.pt``. Returns the path of ``data.pt``.

    Raises:
        ValueError: a finished or partial file spoken with another ``flat_pitch`` or other voices; a voice flite
            does not speak (:func:`render_with_phones`).
    """
    from rvqspec_lib.common.progress import progress_bar
    from rvqspec_lib.data.voices import voice_of
    from recipes.embedded.phones import frame_phones, render_with_phones

    speakers = [v for v in (voice.split(",") if isinstance(voice, str) else voice) if v]
    if not speakers:
        raise ValueError("no voice given: pass a flite voice, or several comma-separated (slt,kal16,awb,rms)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    final, partial = out / "data.pt", out / "data.partial.pt"
    for path in (final, partial):
        if path.is_file():
            old = torch.load(path)
            if old.get("flat_pitch", False) != flat_pitch or voice_set(old) != speakers:
                raise ValueError(f"{path} was spoken with flat_pitch={old.get('flat_pitch', False)} and voices "
                                 f"{','.join(voice_set(old))}: use another --out or pass the same options")
            if path == final:
                return final
    data = torch.load(partial) if partial.is_file() else {"texts": [], "feats": [], "delayed": [], "phones": [],
                                                          "positions": [], "rms": [], "voices": [],
                                                          "flat_pitch": flat_pitch, "voice_set": speakers}
    frames = CodecConfig()
    done = len(data["texts"])
    for i, t in enumerate(progress_bar(list(texts)[done:], desc="speak and featurise", enabled=progress)):
        v = voice_of(t, speakers)
        wav, ph = render_with_phones(t, v, frames.sample_rate, flat_pitch)
        x = RVQCodec.features_for(unit_loudness(wav), frames)
        y = RVQCodec.features_for(unit_loudness(_delayed(wav, 1 + (i % 3))), frames)
        names, pos = frame_phones(ph, x.shape[0], frames.frame_samples / frames.sample_rate)
        data["texts"].append(t)
        data["feats"].append(torch.from_numpy(x).half())
        data["delayed"].append(torch.from_numpy(y).half())
        data["phones"].append(names)
        data["positions"].append(torch.from_numpy(pos))
        data["rms"].append(float(np.sqrt(np.mean(np.square(wav, dtype=np.float64)))))
        data["voices"].append(v)
        if (i + 1) % 500 == 0:
            with atomic_output(partial) as tmp:
                torch.save(data, tmp)
    with atomic_output(final) as tmp:
        torch.save(data, tmp)
    partial.unlink(missing_ok=True)
    return final


# ---------------------------------------------------------------- training
def _windows(feats: list[torch.Tensor], delayed: list[torch.Tensor], n: int, length: int, gen: torch.Generator):
    """``n`` random windows of ``length`` frames: `(n, length, dim)` float32 features and their delayed twins."""
    long = [i for i, f in enumerate(feats) if f.shape[0] >= length]
    xs, ys = [], []
    for _ in range(n):
        i = long[int(torch.randint(len(long), (1,), generator=gen))]
        s = int(torch.randint(feats[i].shape[0] - length + 1, (1,), generator=gen))
        xs.append(feats[i][s: s + length]), ys.append(delayed[i][s: s + length])
    return torch.stack(xs).float(), torch.stack(ys).float()


def train(work: str | os.PathLike, config: LearnedCodecConfig, *, minutes: float = 40.0, batch: int = 32,
          window: int = 24, lr: float = 2e-3, commitment: float = 0.25, consistency: float = 1.0,
          dropout_share: float = 0.5, seed: int = 0, max_steps: int | None = None, progress: bool = True) -> Path:
    """Train a :class:`LearnedCodec` on ``<work>/data.pt`` (:func:`prepare_data`) for ``minutes`` of wall time,
    (or ``max_steps`` steps, whichever ends first), resuming from ``<work>/train.pt``; writes
    ``<work>/codec.safetensors`` and returns its path.

    Loss per window: mean squared error of the standardised features (after the quantiser, with quantiser dropout on
    ``dropout_share`` of the windows), ``commitment`` x the latent's distance to its quantisation, and
    ``consistency`` x the distance between the latents of the audio and of the same audio 1-3 samples later (so
    that inaudible changes move the latent less than a deep stage's step)."""
    from tqdm import tqdm

    from rvqspec_lib.common.progress import progress_file

    work = Path(work)
    data = torch.load(work / "data.pt")
    n_val = max(1, len(data["feats"]) // 20)
    feats, delayed = data["feats"][n_val:], data["delayed"][n_val:]
    val = [f.float() for f in data["feats"][:n_val]]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = LearnedCodec(config)
    allf = torch.cat([f.float() for f in feats])
    model.mean.copy_(allf.mean(0))
    model.std.copy_(allf.std(0).clamp_min(1e-3))
    model.rms.fill_(float(np.median(data["rms"])) if data.get("rms") else 0.1)
    weights = list(model.encoder.parameters()) + list(model.decoder.parameters())
    opt = torch.optim.AdamW(weights, lr=lr, weight_decay=1e-4) if weights else None  # "none": codebooks only
    ckpt, step, log = work / "train.pt", 0, []
    if ckpt.is_file():
        st = torch.load(ckpt)
        if {**st["config"], "encode_beam": 1} != {**asdict(config), "encode_beam": 1}:  # the beam: encoding only
            raise ValueError(f"{ckpt} was trained with another config: remove it or pass the same options")
        model.load_state_dict(st["model"])
        if opt is not None:
            opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"]), torch.set_rng_state(st["rng"])
        step, log = st["step"], st["log"]
    model.train()
    t_end = time.monotonic() + minutes * 60
    bar = tqdm(desc="train codec", unit="step", disable=not progress, file=progress_file())
    last_save = time.monotonic()
    while time.monotonic() < t_end and (max_steps is None or step < max_steps):
        x, y = _windows(feats, delayed, batch, window, gen)
        z = model.latents(x)
        zd = model.latents(y)
        flat = z.reshape(-1, config.latent_dim)
        active = torch.full((batch,), config.n_codebooks)
        drop = torch.rand(batch, generator=gen) < dropout_share
        active[drop] = torch.randint(1, config.n_codebooks + 1, (int(drop.sum()),), generator=gen)
        q, _ = model.quantizer(flat, active.repeat_interleave(window), gen)
        zq = flat + (q - flat).detach()
        rec = model.reconstruct(zq.reshape(batch, window, -1))
        target = (x - model.mean) / model.std
        l_rec = F.mse_loss(rec, target)
        l_commit = F.mse_loss(flat, q.detach())
        l_cons = F.mse_loss(zd, z.detach())
        loss = l_rec + commitment * l_commit + consistency * l_cons
        if opt is not None:
            opt.zero_grad()
            loss.backward()
            opt.step()
        step += 1
        bar.update(1)
        if step % 200 == 0:
            log.append({"step": step, "rec": float(l_rec), "commit": float(l_commit), "cons": float(l_cons)})
            bar.set_postfix(rec=f"{float(l_rec):.3f}", cons=f"{float(l_cons):.4f}")
        if time.monotonic() - last_save > 300:
            _save_state(ckpt, model, opt, gen, step, log, config)
            last_save = time.monotonic()
    bar.close()
    _save_state(ckpt, model, opt, gen, step, log, config)
    model.eval()
    with torch.no_grad():
        val_err = [float(F.mse_loss(model.reconstruct(model.quantizer.decode(model.codes_of_features(v))[None])[0],
                                    (v - model.mean) / model.std)) for v in val if v.shape[0]]
    info = {"steps": step, "validation_mse": float(np.mean(val_err)), "utterances": len(feats),
            "machine": f"{cpu_model()} ({platform.machine()}), torch threads {torch.get_num_threads()}",
            "log": log[-5:]}
    print(json_text(info))
    return model.save(work / "codec.safetensors", info)


def _save_state(path, model, opt, gen, step, log, config):
    with atomic_output(path) as tmp:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict() if opt is not None else None,
                    "gen": gen.get_state(),
                    "rng": torch.get_rng_state(), "step": step, "log": log, "config": asdict(config)}, tmp)


def training_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` English sentences of the training split gathered offline (standard-library docstrings and
    ``/usr/share/doc``; :mod:`recipes.embedded.corpus`), a seeded choice: none is held out by the probe."""
    from recipes.embedded.corpus import assign_splits, gather_sentences

    texts = [s.text for s in assign_splits(gather_sentences(("stdlib", "doc"), multilingual=False))["training"]]
    random.Random(seed).shuffle(texts)
    if n > len(texts):
        raise ValueError(f"--sentences {n} is more than the {len(texts)} training sentences found")
    return texts[:n]


def main(argv: Sequence[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="speak training sentences and store their features")
    d.add_argument("--sentences", type=int, default=4000)
    d.add_argument("--voice", default="slt", help="a flite voice, or several comma-separated (one per sentence, "
                   "as the embedded corpus chooses: slt,kal16,awb,rms)")
    d.add_argument("--out", required=True)
    d.add_argument("--flat-pitch", action="store_true", help="speak with no intonation (the same phones and timing)")
    t = sub.add_parser("train", help="train the codec on a data folder")
    t.add_argument("--work", required=True)
    t.add_argument("--minutes", type=float, default=40.0)
    for f in fields(LearnedCodecConfig):
        t.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    t.add_argument("--consistency", type=float, default=1.0)
    t.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "data":
        return prepare_data(training_texts(a.sentences), a.out, a.voice, flat_pitch=a.flat_pitch)
    cfg = LearnedCodecConfig(**{f.name: getattr(a, f.name) for f in fields(LearnedCodecConfig)})
    return train(a.work, cfg, minutes=a.minutes, consistency=a.consistency, seed=a.seed)


if __name__ == "__main__":
    main()
