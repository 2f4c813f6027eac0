"""Frames (what the inner loop sees) for drafter training and acceptance statistics, and their file format; sources
are in :mod:`rvqspec_lib.data.frame_sources`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rvqspec_lib.common.files import atomic_output, json_text


@dataclass
class Frames:
    """Frames: ``context`` ``(N, 2, talker_hidden)`` float32 = [talker hidden state that emitted code 0, its code-0
    embedding], ``codes`` ``(N, n_codes)`` int64 codes 1..n_codes, ``utterance`` ``(N,)`` int64 (splits keep an
    utterance on one side), ``targets`` cross-entropy targets (``None``: ``codes``; a negative control sets them),
    ``source`` a JSON-able description."""

    context: torch.Tensor
    codes: torch.Tensor
    utterance: torch.Tensor
    targets: torch.Tensor | None = None
    source: dict = field(default_factory=dict)

    def __post_init__(self):
        n = self.context.shape[0]
        if self.context.dim() != 3 or self.context.shape[1] != 2:
            raise ValueError(f"context must be (N, 2, talker_hidden), got {tuple(self.context.shape)}")
        if self.codes.dim() != 2 or self.codes.shape[0] != n or self.utterance.shape != (n,):
            raise ValueError(f"codes (N, n_codes) and utterance (N,) must match context's N={n}: got "
                             f"{tuple(self.codes.shape)}, {tuple(self.utterance.shape)}")
        if self.targets is not None and self.targets.shape != self.codes.shape:
            raise ValueError("targets must have the shape of codes")

    def __len__(self) -> int:
        return int(self.context.shape[0])

    @property
    def n_codes(self) -> int:
        """Codes a frame (15 on released checkpoints)."""
        return int(self.codes.shape[1])

    @property
    def ce_targets(self) -> torch.Tensor:
        """``(N, n_codes)`` int64 cross-entropy targets: :attr:`targets`, or the codes themselves."""
        return self.codes if self.targets is None else self.targets

    def subset(self, idx: torch.Tensor) -> "Frames":
        """The frames at ``idx`` (an index or bool tensor), with their ids, targets and a copy of ``source``."""
        t = None if self.targets is None else self.targets[idx]
        return Frames(self.context[idx], self.codes[idx], self.utterance[idx], t, dict(self.source))

    def split(self, val_fraction: float = 0.1, seed: int = 0) -> tuple["Frames", "Frames"]:
        """``(train, val)`` by whole utterances (by frame if there is one). Raises ValueError: ``val_fraction``
        outside (0, 1) or fewer than 2 frames."""
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if len(self) < 2:
            raise ValueError("need at least 2 frames to split into training and validation")
        g = torch.Generator().manual_seed(seed)
        utts = torch.unique(self.utterance)
        if len(utts) >= 2:
            perm = utts[torch.randperm(len(utts), generator=g)]
            n_val = min(len(utts) - 1, max(1, round(val_fraction * len(utts))))
            is_val = torch.isin(self.utterance, perm[:n_val])
        else:
            perm = torch.randperm(len(self), generator=g)
            is_val = torch.zeros(len(self), dtype=torch.bool)
            is_val[perm[: min(len(self) - 1, max(1, round(val_fraction * len(self))))]] = True
        return self.subset(~is_val), self.subset(is_val)

    @staticmethod
    def cat(parts: Sequence["Frames"], *, keep_ids: bool = False) -> "Frames":
        """Concatenate frame sets, utterance ids renumbered to stay distinct (``keep_ids``: kept, one numbering
        already). Raises ValueError: no frames at all."""
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("no frames to concatenate")
        utt, base = [], 0
        for p in parts:
            u = p.utterance if keep_ids else torch.unique(p.utterance, return_inverse=True)[1] + base
            utt.append(u)
            base = int(u.max()) + 1
        tg = None
        if any(p.targets is not None for p in parts):
            tg = torch.cat([p.ce_targets for p in parts])
        return Frames(torch.cat([p.context for p in parts]), torch.cat([p.codes for p in parts]), torch.cat(utt), tg,
                      {"parts": [p.source for p in parts]})

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (``.safetensors``; ``source`` in the header metadata), atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        t = {"context": self.context.contiguous(), "codes": self.codes.contiguous(),
             "utterance": self.utterance.contiguous()}
        if self.targets is not None:
            t["targets"] = self.targets.contiguous()
        with atomic_output(path) as tmp:
            save_file(t, str(tmp), metadata={"rvqspec_frames": json_text(self.source, indent=None)})
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Frames":
        """Read a file written by :meth:`save`. Raises FileNotFoundError / ValueError with the path."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no frames file {path}: make one with frames_from_model / frames_from_dataset "
                                    "and Frames.save")
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if "rvqspec_frames" not in meta:
            raise ValueError(f"{path} is not an rvqspec frames file")
        t = load_file(str(path))
        return cls(t["context"], t["codes"], t["utterance"], t.get("targets"), json.loads(meta["rvqspec_frames"]))
