"""A small neural code decoder for the offline :class:`~rvqspec_lib.models.rvq_codec.RVQCodec`: codes -> log-mel frames,
trained on generated codes (:mod:`recipes.embedded.code_decoder_training`) to learn from neighbouring frames how
much to trust each codebook, as vocoders are fine-tuned on the acoustic model's own predictions (HiFi-GAN, Kong et al.
2020, §4.4). Its head adds a correction to the weighted centroid sum, zero at init: an untrained decoder IS the table
decoder. It sits after the inner loop: speculation is unaffected.
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

from rvqspec_lib.common.files import atomic_output, json_text

FORMAT = "rvqspec-code-decoder"


@dataclass(frozen=True)
class CodeDecoderConfig:
    """Shape of a :class:`CodeDecoder`: ``hidden`` channels, ``n_blocks`` residual blocks, ``kernel`` frames per
    convolution, ``dilations`` cycled over the blocks (the defaults see +-14 frames)."""

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
        codebooks: the codec's ``(G, V, dim)`` float32 centroids (a buffer: never trained, never saved here).
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
        """One utterance: ``(frames, G)`` integer codes -> ``(frames, dim)`` float32 numpy (``n_codebooks=k``: the
        first k codebooks only)."""
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
        """Write the trained parameters (not the codebooks) to a safetensors file, atomically, ``meta`` in its
        metadata, in ``dtype`` (:meth:`load` returns float32); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        with atomic_output(p) as tmp:
            save_file(state, str(tmp), metadata={"format": FORMAT,
                                                 "config": json_text(asdict(self.config), indent=None),
                                                 "meta": json_text(meta or {}, indent=None)})
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
                                    "recipes.embedded.code_decoder_training.train_code_decoder")
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
