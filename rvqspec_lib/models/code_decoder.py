"""A small neural code decoder for the offline :class:`~rvqspec_lib.models.rvq_codec.RVQCodec`: codes -> log-mel frames.

Why: the residual k-means codec decodes by summing one centroid per codebook. With the TRUE codes that is the best
per-frame reconstruction, but codes 1..15 that the code predictor samples are plausible and wrong, and their
centroids add up to spectral noise that Griffin-Lim turns into noise you hear (the embedded model's inner loop:
WER 0.887 on true code 0 + generated codes 1..15, worse than code 0 alone, 0.64). A decoder that has seen generated
codes learns how much to trust each codebook from the context of neighbouring frames. This is the vocoder practice of
fine-tuning on the acoustic model's own (teacher-forced) predictions, as HiFi-GAN (Kong et al., 2020, section 4.4)
does for Tacotron 2 mels; here the acoustic model is the code predictor and the decoder outputs log-mel frames that
the codec's Griffin-Lim path turns into audio. It sits after the inner loop: speculative decoding is unaffected
(it changes which codes are emitted in no way).

The network (:class:`CodeDecoder`): each codebook's centroid ``c_k[code_k]`` (the codec's own tables, scaled per
stage) goes through its own linear map into ``hidden`` channels; the 16 maps are summed (an absent codebook uses a
learned vector instead: quantizer dropout as in SoundStream, so ``n_codebooks < 16`` decodes too); residual
dilated 1-D convolutions over frames; a linear head adds a correction to the weighted centroid sum
``sum_k a_k c_k[code_k]`` (``a_k`` learned, starting at 1; the head starts at 0, so an untrained decoder IS the table
decoder).

Training it is part of building the embedded model: :mod:`rvqspec_lib.embedded.code_decoder_training`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from rvqspec_lib.common.files import atomic_output

FORMAT = "rvqspec-code-decoder"


@dataclass(frozen=True)
class CodeDecoderConfig:
    """Shape of a :class:`CodeDecoder`.

    Attributes:
        hidden: channels of the convolution stack (256).
        n_blocks: residual blocks (4).
        kernel: frames each convolution sees (5 = 400 ms).
        dilations: dilation of each block, cycled (1, 2, 4, 1): a receptive field of +-14 frames (1.1 s).
    """

    hidden: int = 256
    n_blocks: int = 4
    kernel: int = 5
    dilations: tuple = (1, 2, 4, 1)


class _Block(nn.Module):
    def __init__(self, ch: int, kernel: int, dilation: int):
        super().__init__()
        self.norm = nn.GroupNorm(1, ch)
        self.conv = nn.Conv1d(ch, ch, kernel, dilation=dilation, padding=dilation * (kernel // 2))
        self.mix = nn.Conv1d(ch, ch, 1)

    def forward(self, x):  # (B, C, F)
        return x + self.mix(F.gelu(self.conv(self.norm(x))))


class CodeDecoder(nn.Module):
    """Codes ``(B, F, G)`` -> stacked log-mel frame vectors ``(B, F, dim)`` (the codec's feature space).

    Args:
        codebooks: the codec's ``(G, V, dim)`` float32 centroid tables (kept as a buffer, never trained, never saved
            in this module's file: :meth:`load` takes them from the codec).
        config: :class:`CodeDecoderConfig`.
    """

    def __init__(self, codebooks: torch.Tensor, config: CodeDecoderConfig | None = None):
        super().__init__()
        self.config = config or CodeDecoderConfig()
        g, v, dim = codebooks.shape
        h = self.config.hidden
        self.register_buffer("codebooks", codebooks.float().contiguous(), persistent=False)
        rms = codebooks.float().pow(2).mean((1, 2)).sqrt().clamp_min(1e-6)  # (G,) per-stage scale
        self.register_buffer("stage_scale", 1.0 / rms, persistent=False)
        self.proj = nn.Parameter(torch.randn(g, dim, h) / math.sqrt(dim * g))
        self.absent = nn.Parameter(torch.zeros(g, h))
        self.stage_weight = nn.Parameter(torch.ones(g))
        self.blocks = nn.ModuleList(_Block(h, self.config.kernel, self.config.dilations[i % len(self.config.dilations)])
                                    for i in range(self.config.n_blocks))
        self.norm = nn.GroupNorm(1, h)
        self.head = nn.Conv1d(h, dim, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @property
    def n_codebooks(self) -> int:
        return int(self.codebooks.shape[0])

    def forward(self, codes: torch.Tensor, present: torch.Tensor | None = None) -> torch.Tensor:
        """Args:
            codes: ``(B, F, G)`` int64 in ``[0, V)``.
            present: ``(B, G)`` bool, False where a codebook is absent (None: all present).
        Returns:
            ``(B, F, dim)`` float32 log-mel frame vectors.
        """
        b, f, g = codes.shape
        c = self.codebooks[torch.arange(g, device=codes.device)[None, None], codes]  # (B, F, G, dim)
        if present is None:
            present = torch.ones(b, g, dtype=torch.bool, device=codes.device)
        m = present[:, None, :, None].to(c.dtype)  # (B, 1, G, 1)
        skip = (c * (self.stage_weight[None, None, :, None] * m)).sum(2)  # (B, F, dim)
        z = torch.einsum("bfgd,gdh->bfgh", c * self.stage_scale[None, None, :, None], self.proj)  # (B, F, G, H)
        z = (z * m + self.absent[None, None] * (1 - m)).sum(2)  # (B, F, H)
        x = z.transpose(1, 2)  # (B, H, F)
        for blk in self.blocks:
            x = blk(x)
        return skip + self.head(F.gelu(self.norm(x))).transpose(1, 2)

    @torch.no_grad()
    def vectors(self, codes, n_codebooks: int | None = None) -> np.ndarray:
        """One utterance: ``(frames, G)`` integer codes -> ``(frames, dim)`` float32 log-mel frame vectors (numpy).
        ``n_codebooks=k`` decodes from the first k codebooks only (the others absent)."""
        c = torch.as_tensor(np.asarray(codes), dtype=torch.long)[None]
        present = torch.ones(1, self.n_codebooks, dtype=torch.bool)
        if n_codebooks is not None:
            present[:, int(n_codebooks):] = False
        was = self.training
        self.eval()
        try:
            return self.forward(c, present)[0].numpy().astype(np.float32)
        finally:
            self.train(was)

    def n_parameters(self) -> int:
        """Trained parameters (the codebooks are the codec's, not counted)."""
        return sum(p.numel() for p in self.parameters())

    # ---------------------------------------------------------------- files
    def save(self, path: str | os.PathLike, meta: dict | None = None, dtype: torch.dtype = torch.float32) -> Path:
        """Write the trained parameters (not the codebooks) to a safetensors file; ``meta`` goes in its metadata.
        ``dtype=torch.float16`` halves the file (:meth:`load` always returns float32 parameters). Written atomically
        (:func:`rvqspec_lib.common.files.atomic_output`); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        with atomic_output(p) as tmp:
            save_file(state, str(tmp), metadata={"format": FORMAT, "config": json.dumps(asdict(self.config)),
                                                 "meta": json.dumps(meta or {})})
        return p

    @classmethod
    def load(cls, path: str | os.PathLike, codebooks: torch.Tensor) -> "CodeDecoder":
        """Read a decoder written by :meth:`save` for a codec with these ``(G, V, dim)`` codebooks.

        Raises:
            FileNotFoundError: no such file. ValueError: not a code-decoder file, or trained for other codebooks.
        """
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no code decoder at {p}: train one with `make embedded` (stage 'decoder') or "
                                    "rvqspec_lib.embedded.code_decoder_training.train_code_decoder")
        try:
            with safe_open(str(p), framework="pt") as f:
                md = f.metadata() or {}
                state = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # safetensors' own error types: a file of another format
            raise ValueError(f"{p} is not a code-decoder file (not readable as safetensors: {e})") from None
        if md.get("format") != FORMAT:
            raise ValueError(f"{p} is not a code-decoder file (format {md.get('format')!r})")
        raw = json.loads(md.get("config", "{}"))
        raw["dilations"] = tuple(raw.get("dilations", (1, 2, 4, 1)))
        dec = cls(codebooks, CodeDecoderConfig(**raw))
        if tuple(state["proj"].shape[:2]) != tuple(codebooks.shape[::2]):
            raise ValueError(f"{p} was trained for codebooks of shape (G, *, dim) = "
                             f"{tuple(state['proj'].shape[:2])}, this codec has {tuple(codebooks.shape)}")
        dec.load_state_dict({k: v.float() for k, v in state.items()})
        dec.meta = json.loads(md.get("meta", "{}"))
        return dec.eval()
