"""Training the drafters of :mod:`rvqspec_lib.decoding.drafters` on teacher-forced hidden states H_1..H_15 of the
frozen code predictor (paper §2.2, Table 2; docs/methods.md#position-aware-offsets), with one of three losses
(:func:`train_drafter`), keeping the epoch of highest exact validation acceptance (epoch 0: the untrained drafter).
Table 2's plan of five drafters and its learning-rate sweep are the notebook's (paper/drafter_training.py).
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rvqspec_lib.common.files import write_json_atomic
from rvqspec_lib.common.provenance import git_revision
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.data.teacher import teacher_forced_hidden, verifier_logits
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.drafters import draft_batch
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.training.loop import Budget, fit

LOSSES = ("ce", "kl", "tv")


#: Adam learning rates by drafter: offsets are a few vectors on the scale of a normed hidden state (large steps are
#: safe); Medusa heads start from the LM heads (Medusa-1 trains its heads at 1e-3).
DEFAULT_LR = {"offsets": 1e-2, "medusa": 1e-3}


def _drafter_loss(drafter, code_predictor, hidden: torch.Tensor, targets: torch.Tensor, *, loss: str,
                  sampling: Sampling, p_all: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """``(loss, {"acceptance_by_offset": (K,)})`` on hidden ``(N, n, H)``, codes ``(N, n)``, warped p ``(N, n, V)``."""
    logits, d, valid = draft_batch(drafter, code_predictor, hidden, drafter.K)
    nb, n = targets.shape
    f = torch.arange(nb, device=hidden.device)[:, None, None].expand_as(d)
    dd = (d - 1).clamp(max=n - 1)
    p = p_all[f, dd]  # (N, n-1, K, V)
    if loss == "ce":  # ground-truth codes, the paper's
        tgt = targets[f, dd]
        value = torch.nn.functional.cross_entropy(logits[valid], tgt[valid])
    elif loss == "tv":  # 1 - sum_x min(p, q) with q warped as deployed: exactly one minus the acceptance rate
        q = sampling.probs(logits[valid])  # temperature and top-k are differentiable in the kept logits
        value = 1.0 - torch.minimum(p[valid], q).sum(-1).mean()
    else:  # KL(p || q), q tempered but not truncated: a truncated q makes the KL infinite
        temp = 1.0 if sampling.greedy else float(sampling.temperature)
        log_q = torch.log_softmax(logits[valid] / temp, -1)
        pv = p[valid]
        value = (torch.special.xlogy(pv, pv) - pv * log_q).sum(-1).mean()
    with torch.no_grad():
        acc = torch.minimum(p, sampling.probs(logits.detach())).sum(-1)  # (N, n-1, K)
        w = valid.float()
        by_j = (acc * w).sum((0, 1)) / w.sum((0, 1)).clamp_min(1)
    return value, {"acceptance_by_offset": by_j}


@dataclass
class TrainResult:
    """What :func:`train_drafter` returns: the drafter at its kept epoch (``provenance`` filled), the
    :func:`~rvqspec_lib.training.loop.fit` curve (epoch 0: untrained; ``train_loss``, ``val_loss``, exact
    ``val_acceptance_by_offset`` and its mean ``val_acceptance``), the kept epoch, whether patience stopped it."""

    drafter: object
    curve: list[dict]
    best_epoch: int
    stopped_early: bool

    def to_json(self) -> dict:
        """JSON-able: description, kept epoch, stopped early, curve, provenance."""
        return {"drafter": self.drafter.describe(), "best_epoch": self.best_epoch, "stopped_early": self.stopped_early,
                "curve": self.curve, "provenance": self.drafter.provenance}


class _HiddenSource:
    """Teacher-forced hidden states of frames and the frozen verifier's warped p on them, cached up to ``cache_mb``
    (hidden first, then p, which never changes), else per batch."""

    @torch.no_grad()
    def __init__(self, cp, frames: Frames, chunk: int, cache_mb: float, sampling: Sampling):
        self.cp, self.frames, self.sampling = cp, frames, sampling
        self.dev = next(cp.parameters()).device
        row_bytes = len(frames) * frames.n_codes * P.param_dtype(cp).itemsize
        hidden_bytes, p_bytes = row_bytes * int(cp.config.hidden_size), row_bytes * int(cp.config.vocab_size)
        fits = hidden_bytes <= cache_mb * 2 ** 20, hidden_bytes + p_bytes <= cache_mb * 2 ** 20
        chunks = [torch.arange(i, min(i + chunk, len(frames))) for i in range(0, len(frames), chunk)]
        self.cache = torch.cat([self._compute(idx) for idx in chunks]) if fits[0] else None
        self.p_cache = torch.cat([self._probs(self.cache[idx]) for idx in chunks]) if all(fits) else None

    def _compute(self, idx):
        fr = self.frames
        return teacher_forced_hidden(self.cp, fr.context[idx].to(self.dev), fr.codes[idx].to(self.dev))

    def _probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.sampling.probs(verifier_logits(self.cp, hidden))  # (B, n, V)

    @torch.no_grad()
    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        return self.cache[idx] if self.cache is not None else self._compute(idx)

    @torch.no_grad()
    def probs(self, idx: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.p_cache[idx] if self.p_cache is not None else self._probs(hidden)


@torch.no_grad()
def _evaluate(drafter, cp, src: _HiddenSource, *, loss, sampling, batch_size,
              parallel=None) -> tuple[float, list[float]]:
    """Validation loss and exact acceptance by offset over ``src`` (with ``parallel``: over every process's block)."""
    tot, acc, count = 0.0, None, 0
    frames = src.frames
    for i in range(0, len(frames), batch_size):
        idx = torch.arange(i, min(i + batch_size, len(frames)))
        hidden = src(idx)
        value, st = _drafter_loss(drafter, cp, hidden, frames.ce_targets[idx].to(src.dev), loss=loss,
                                  sampling=sampling, p_all=src.probs(idx, hidden))
        tot += float(value.detach()) * len(idx)
        a = st["acceptance_by_offset"].double() * len(idx)
        acc = a if acc is None else acc + a
        count += len(idx)
    if parallel is not None and parallel.world > 1:
        sums = torch.cat([torch.tensor([tot, float(count)], dtype=torch.float64),
                          (acc.cpu() if acc is not None else torch.zeros(drafter.K, dtype=torch.float64))])
        parallel.all_reduce_(sums)
        tot, count, acc = float(sums[0]), int(sums[1]), sums[2:]
    return tot / count, (acc / count).tolist()


def train_drafter(drafter, code_predictor, train: Frames, val: Frames | None = None, *, loss: str = "ce",
                  sampling: Sampling | None = None, lr: float | None = None, batch_size: int = 64,
                  max_epochs: int = 20, patience: int = 3, val_fraction: float = 0.1,
                  seed: int = 0, cache_mb: float = 1024, progress: bool = False,
                  curve_path: str | os.PathLike | None = None, select: str = "acceptance",
                  parallel=None) -> TrainResult:
    """Train a drafter (``PositionOffsets`` or ``MedusaHeads``) in place with Adam at a constant rate through
    :func:`~rvqspec_lib.training.loop.fit`, an epoch a seeded permutation of ``train``; the code predictor is frozen.

    Args:
        val: default ``val_fraction`` of ``train``'s utterances. lr: default :data:`DEFAULT_LR`'s.
        loss: ``"ce"`` (ground-truth codes, the paper's), ``"kl"`` (KL(p || q) to the warped verifier) or ``"tv"``
            (one minus the exact acceptance, q warped as deployed: DistillSpec). sampling: the deployed warpers.
        max_epochs, patience, select (``"acceptance"`` or ``"loss"``): early stopping on validation (by >1e-4).
        seed: of the batch order (the only randomness). cache_mb: memory for cached hidden states and p.
        curve_path: also write :meth:`TrainResult.to_json` here (main process only).
        parallel: a :class:`~rvqspec_lib.training.distributed.Parallel`: every process passes the SAME frames and
            takes the single-process step (gradients summed; equal up to float32 rounding).

    Raises:
        ValueError: a drafter without parameters, an unknown loss or select, ``"tv"`` with greedy sampling, frames
            of another code predictor.
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}: choose one of {LOSSES}")
    if select not in ("acceptance", "loss"):
        raise ValueError(f"unknown select {select!r}: choose 'acceptance' or 'loss'")
    params = [p for p in getattr(drafter, "parameters", lambda: [])()]
    if not params:
        raise ValueError(f"{getattr(drafter, 'name', drafter)!r} has nothing to train: use offsets or medusa")
    cp = code_predictor
    n = P.n_codes(cp)
    if train.n_codes != n or (val is not None and val.n_codes != n):
        raise ValueError(f"frames have {train.n_codes} codes a frame, the code predictor {n}")
    sampling = Sampling() if sampling is None else sampling
    if loss == "tv" and sampling.greedy:
        raise ValueError("loss 'tv' needs sampled decoding (a greedy q is a point mass with no gradient)")
    if val is None:
        train, val = train.split(val_fraction, seed)
    lr = DEFAULT_LR.get(drafter.name, 1e-3) if lr is None else lr
    frozen = {p: p.requires_grad for p in cp.parameters()}
    was_training = cp.training
    try:
        for p in cp.parameters():
            p.requires_grad_(False)
        cp.eval()
        par = parallel
        world = 1 if par is None else par.world
        t0, t1 = (0, len(train)) if world == 1 else par.block(len(train))
        v0, v1 = (0, len(val)) if world == 1 else par.block(len(val))
        train_mine = train if world == 1 else train.subset(torch.arange(t0, t1))
        tr_src = _HiddenSource(cp, train_mine, batch_size, cache_mb, sampling)
        va_src = _HiddenSource(cp, val if world == 1 else val.subset(torch.arange(v0, v1)), batch_size, cache_mb,
                               sampling)
        opt = torch.optim.Adam(params, lr=lr)
        if world > 1:
            opt = par.summed_gradients(opt, params)
        gen = torch.Generator().manual_seed(seed)

        def epoch_batches(epoch: int):
            order = torch.randperm(len(train), generator=gen)
            return [order[i: i + batch_size] for i in range(0, len(train), batch_size)]

        def step(idx):
            mine = idx[(idx >= t0) & (idx < t1)] - t0  # this process's part of the global batch (all of it alone)
            if len(mine):
                hidden = tr_src(mine)
                value, _ = _drafter_loss(drafter, cp, hidden, train_mine.ce_targets[mine].to(tr_src.dev),
                                         loss=loss, sampling=sampling, p_all=tr_src.probs(mine, hidden))
            else:  # nothing here: a zero loss that still takes part in the gradient sum
                value = sum(p.sum() for p in params) * 0.0
            if world == 1:
                return value
            value = value * (len(mine) / len(idx))  # its share of the global batch mean
            total = par.all_reduce_(value.detach().double().reshape(1).clone())
            return value, {"loss": float(total)}

        def evaluation():
            drafter.eval()
            v_loss, v_acc = _evaluate(drafter, cp, va_src, loss=loss, sampling=sampling, batch_size=batch_size,
                                      parallel=par)
            drafter.train()
            return {"val_loss": v_loss, "val_acceptance_by_offset": v_acc, "val_acceptance": float(np.mean(v_acc))}

        res = fit(step, epoch_batches, optimizer=opt, budget=Budget(epochs=max_epochs), evaluate=evaluation,
                  eval_every="epoch", eval_at_start=True,
                  metric="val_acceptance" if select == "acceptance" else "val_loss",
                  select="max" if select == "acceptance" else "min", min_delta=1e-4, patience=patience,
                  keep_best=drafter.state_dict(), batch_weight=len, progress=progress,
                  desc=f"training {drafter.name} ({loss})")
        drafter.eval()
    finally:
        for p, flag in frozen.items():
            p.requires_grad_(flag)
        cp.train(was_training)
    curve, best_epoch, stopped = res.curve, res.best_epoch, res.stopped_by == "patience"
    kept = res.best_record
    drafter.provenance = {
        "loss": loss, "sampling": sampling.describe(),
        "optimizer": "adam", "lr": lr, "batch_size": batch_size, "max_epochs": max_epochs, "patience": patience,
        "select": select, "epochs_run": curve[-1]["epoch"], "best_epoch": best_epoch, "stopped_early": stopped,
        "seed": seed,
        "val_loss": kept["val_loss"], "val_acceptance_by_offset": kept["val_acceptance_by_offset"],
        "val_acceptance_at_init": curve[0]["val_acceptance_by_offset"],
        "n_train_frames": len(train), "n_val_frames": len(val), "data": train.source,
        "processes": 1 if parallel is None else parallel.world,
        "git": git_revision(), "created_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
    }
    result = TrainResult(drafter, curve, best_epoch, stopped)
    if curve_path is not None and (parallel is None or parallel.is_main):
        Path(curve_path).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(curve_path, result.to_json())
    return result
