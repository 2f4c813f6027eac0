"""How the shipped model's trainers optimise (nanoGPT's recipe): AdamW with weight decay on matrices only, a linear
warmup then a cosine decay of the learning rate (:class:`WarmupCosine`, a ``schedule`` of
:func:`rvqspec_lib.training.loop.fit`), gradients clipped, and exactly one budget of steps or minutes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch

from rvqspec_lib.training.loop import Budget

#: Cosine decay ends at this fraction of the peak learning rate (nanoGPT: ``min_lr = lr / 10``).
MIN_LR_RATIO = 0.1
#: Linear warmup steps before the cosine decay (the joint trainer's and the code decoder's; the code-predictor
#: stage, which starts from trained weights, uses half).
WARMUP_STEPS = 100
#: AdamW weight decay of matrices (nanoGPT's groups: no decay on vectors, see :func:`decay_groups`).
WEIGHT_DECAY = 0.01
#: Largest global gradient norm (clipped above it).
GRAD_CLIP = 1.0
#: AdamW betas of the transformer trainers (nanoGPT's; beta2 0.95 for short, noisy runs).
ADAMW_BETAS = (0.9, 0.95)


def lr_at(step: int, frac: float, *, lr: float, warmup_steps: int = WARMUP_STEPS,
          min_lr_ratio: float = MIN_LR_RATIO) -> float:
    """Learning rate at 0-based step ``step``: linear warmup, then cosine in ``frac`` (budget spent, [0, 1])."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, frac))))
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * cos)


@dataclass(frozen=True)
class WarmupCosine:
    """The schedule of :func:`lr_at` as a callable ``(step, frac) -> lr`` for ``fit`` (``lr``: the peak)."""

    lr: float
    warmup_steps: int = WARMUP_STEPS
    min_lr_ratio: float = MIN_LR_RATIO

    def __call__(self, step: int, frac: float) -> float:
        return lr_at(step, frac, lr=self.lr, warmup_steps=self.warmup_steps, min_lr_ratio=self.min_lr_ratio)


def one_budget(steps: int | None = None, minutes: float | None = None) -> Budget:
    """A :class:`~rvqspec_lib.training.loop.Budget` of exactly one of ``steps`` and ``minutes`` (the transformer
    trainers' rule); else ValueError."""
    if (steps is None) == (minutes is None):
        raise ValueError("give exactly one budget: steps=... or minutes=...")
    return Budget(steps=steps, minutes=minutes)


def decay_groups(parameters: Iterable[torch.nn.Parameter], weight_decay: float = WEIGHT_DECAY) -> list[dict]:
    """Two AdamW groups of the trainable parameters: weight decay on matrices, none on vectors."""
    params = [p for p in parameters if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
