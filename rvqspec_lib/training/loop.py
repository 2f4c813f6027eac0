"""The one training loop shared by every trainer (docs/architecture.md#training-embedded-cli): :func:`fit` does the
budget, the learning-rate schedule it is given, evaluation, early stopping, the best state and the
curve. Batches are drawn lazily, one per step; the loop draws no random number itself (docs/style.md#randomness).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, Sized

import torch
from tqdm import tqdm

from rvqspec_lib.common.files import write_json_atomic

SELECT = ("min", "max")


@dataclass(frozen=True)
class Budget:
    """How long :func:`fit` trains: ``steps``, ``minutes`` (wall time) and/or ``epochs``; the first spent stops it.
    Raises ValueError: no budget, or one that is not positive (steps and epochs must be integers)."""

    steps: int | None = None
    minutes: float | None = None
    epochs: int | None = None

    def __post_init__(self):
        if self.steps is None and self.minutes is None and self.epochs is None:
            raise ValueError("give a training budget: steps=..., minutes=... or epochs=...")
        for name in ("steps", "epochs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"the budget must be positive: {name} must be an integer >= 1, got {v!r}")
        if self.minutes is not None and not self.minutes > 0:
            raise ValueError(f"the budget must be positive: minutes must be > 0, got {self.minutes!r}")

    def spent(self, step: int, epoch: int, elapsed_s: float) -> str | None:
        """The first budget spent (``"steps"``, ``"minutes"``, ``"epochs"``), or ``None`` while training may go on."""
        return next((name for name, f in self._fractions(step, epoch, elapsed_s) if f >= 1), None)

    def fraction(self, step: int, epoch: int, elapsed_s: float) -> float:
        """The largest fraction spent of the budgets given (what the cosine follows; complete epochs only)."""
        return max(f for _, f in self._fractions(step, epoch, elapsed_s))

    def _fractions(self, step, epoch, elapsed_s):
        """``(name, fraction spent)`` of each budget given, in the order steps, minutes, epochs."""
        given = (("steps", step, self.steps), ("minutes", elapsed_s, self.minutes and self.minutes * 60),
                 ("epochs", epoch, self.epochs))
        return [(name, done / total) for name, done, total in given if total is not None]


def write_curve(path: str | os.PathLike, curve: Sequence[dict], meta: Mapping | None = None) -> Path:
    """Write ``{"meta": meta, "curve": curve}`` as JSON to ``path``, atomically. Returns the path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_json_atomic(path, {"meta": dict(meta or {}), "curve": list(curve)})


@dataclass
class FitResult:
    """What :func:`fit` returns. ``curve``: a dict per record (``step, epoch, elapsed_s, lr``, the running means,
    then what ``evaluate`` returned); ``stopped_by``: a budget's name or ``"patience"``; ``best_index``: in ``curve``
    (``None`` without a metric); ``restored``: ``keep_best`` set to it; ``steps``, ``epochs``: taken, completed;
    ``wall_s``, ``train_s``: seconds in :func:`fit`, in steps (evaluations excluded)."""

    curve: list[dict]
    steps: int
    epochs: int
    stopped_by: str
    best_index: int | None
    restored: bool
    wall_s: float
    train_s: float

    @property
    def best_record(self) -> dict | None:
        """The best record of :attr:`curve` (``None`` without a metric)."""
        return None if self.best_index is None else self.curve[self.best_index]

    @property
    def best_step(self) -> int | None:
        """Optimiser steps taken at the best record."""
        return None if self.best_index is None else self.best_record["step"]

    @property
    def best_epoch(self) -> int | None:
        """Epochs completed at the best record."""
        return None if self.best_index is None else self.best_record["epoch"]


def _improves(value: float, best: float | None, select: str, min_delta: float) -> bool:
    if value is None or math.isnan(value):  # NaN never improves
        return False
    if best is None:
        return True
    return value < best - min_delta if select == "min" else value > best + min_delta


def fit(step_fn: Callable[[Any], torch.Tensor | tuple[torch.Tensor, Mapping[str, float]]],
        batches: Callable[[int], Iterable], *, optimizer: torch.optim.Optimizer, budget: Budget,
        schedule: Callable[[int, float], float] | None = None,
        clip_parameters: Iterable[torch.Tensor] | None = None, grad_clip: float | None = None,
        evaluate: Callable[[], Mapping[str, Any]] | None = None, eval_every: int | str | None = None,
        eval_at_start: bool = False, metric: str | Callable[[dict], float] | None = None, select: str = "min",
        min_delta: float = 0.0, patience: int | None = None, keep_best: Mapping[str, torch.Tensor] | None = None,
        running: Sequence[str] = ("loss",), running_prefix: str = "train_",
        batch_weight: Callable[[Any], float] | None = None,
        on_record: Callable[[dict, bool], None] | None = None, curve_path: str | os.PathLike | None = None,
        curve_meta: Mapping | None = None, progress: bool = False, desc: str = "train", log_records: bool = False,
        clock: Callable[[], float] = time.perf_counter) -> FitResult:
    """Train until the budget is spent or patience runs out; evaluate, select and keep the best state.

    Args:
        step_fn: ``batch -> loss`` (a scalar tensor with a graph) or ``(loss, stats)`` (a dict of floats).
        batches: ``epoch -> iterable of batches``; an epoch ends after ``len()`` batches or when it is exhausted.
        schedule: ``(step, frac) -> lr`` (e.g. a warmup and cosine decay); ``None`` keeps the optimiser's.
        clip_parameters, grad_clip: clip their global gradient norm (not when either is ``None`` or 0).
        evaluate: ``() -> dict`` merged into each record. eval_every: steps between records (0, ``None``: none),
            or ``"epoch"``; a record is also made after the last step and, with ``eval_at_start``, before the first.
        metric: record key (or ``record -> float``) selected on (``None``: no selection, no early stopping);
            ``select`` ``"min"`` or ``"max"``, improving by more than ``min_delta`` (ties keep the earlier, NaN never).
        patience: records in a row without improvement before stopping (``None``: never).
        keep_best: named tensors restored in place to the best record's at the end.
        running, running_prefix, batch_weight: step statistics averaged (weighted) between records.
        on_record: ``(record, improved) -> None``. curve_path, curve_meta: :func:`write_curve` after each record.
        progress, desc, log_records: a tqdm bar; ``log_records`` also prints each record. clock: monotonic seconds.

    Raises:
        ValueError: an unknown ``select``, a bad ``eval_every`` or ``patience``, or an epoch without batches.
    """
    if select not in SELECT:
        raise ValueError(f"select must be one of {SELECT}, got {select!r}")
    if eval_every == "epoch":
        per_epoch, every = True, 0
    elif eval_every is None or (isinstance(eval_every, int) and not isinstance(eval_every, bool) and eval_every >= 0):
        per_epoch, every = False, int(eval_every or 0)
    else:
        raise ValueError(f"eval_every must be a number of steps >= 0, None or 'epoch', got {eval_every!r}")
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 0):
        raise ValueError(f"patience must be an integer >= 0 or None, got {patience!r}")
    curve: list[dict] = []
    sums = {k: 0.0 for k in running}
    weight_sum = 0
    best_value, best_index, best_state, bad = None, None, None, 0
    step, epoch, train_s = 0, 0, 0.0
    bar = tqdm(total=budget.steps, desc=desc, unit="step", disable=not progress, leave=False)
    t0 = clock()

    def value_of(rec):
        if metric is None:
            return None
        v = metric(rec) if callable(metric) else rec.get(metric)
        return None if v is None else float(v)

    def record() -> bool:
        """Append a record, update the best; True when patience has run out."""
        nonlocal best_value, best_index, best_state, bad, weight_sum
        rec = {"step": step, "epoch": epoch, "elapsed_s": round(clock() - t0, 2),
               "lr": optimizer.param_groups[0]["lr"]}
        rec.update({running_prefix + k: (sums[k] / weight_sum if weight_sum else None) for k in running})
        if evaluate is not None:
            rec.update(evaluate())
        for k in sums:
            sums[k] = 0.0
        weight_sum = 0
        curve.append(rec)
        v = value_of(rec)
        improved = metric is not None and _improves(v, best_value, select, min_delta)
        if improved:
            best_value, best_index, bad = v, len(curve) - 1, 0
            if keep_best is not None:
                best_state = {k: t.detach().clone() for k, t in keep_best.items()}
        elif metric is not None:
            bad += 1
        if curve_path is not None:
            write_curve(curve_path, curve, curve_meta)
        if on_record is not None:
            on_record(rec, improved)
        if progress:
            if v is not None:
                bar.set_postfix({metric if isinstance(metric, str) else "metric": f"{v:.4g}"})
            if log_records:
                bar.write(" ".join(f"{k}={x:.4g}" if isinstance(x, float) else f"{k}={x}" for k, x in rec.items()
                                   if isinstance(x, (int, float, str)) or x is None))
        return patience is not None and not improved and bad >= patience

    stopped_by = None
    try:
        if eval_at_start and record():
            stopped_by = "patience"
        while stopped_by is None:
            stopped_by = budget.spent(step, epoch, clock() - t0)
            if stopped_by is not None:
                break
            src = batches(epoch)
            size = len(src) if isinstance(src, Sized) else None  # known length: the epoch ends with its last step
            if size == 0:
                raise ValueError(f"epoch {epoch} has no batches: is the training set empty?")
            it, n_batches = iter(src), 0
            while size is None or n_batches < size:
                elapsed = clock() - t0
                stopped_by = budget.spent(step, epoch, elapsed)  # before the batch is drawn: no draw is wasted
                if stopped_by is not None:
                    break
                try:
                    batch = next(it)
                except StopIteration:
                    if n_batches == 0:
                        raise ValueError(f"epoch {epoch} has no batches: is the training set empty?") from None
                    break
                if schedule is not None:
                    lr = schedule(step, budget.fraction(step, epoch, elapsed))
                    for group in optimizer.param_groups:
                        group["lr"] = lr
                ts = clock()
                out = step_fn(batch)
                loss, stats = out if isinstance(out, tuple) else (out, None)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if grad_clip and clip_parameters is not None:
                    torch.nn.utils.clip_grad_norm_(clip_parameters, grad_clip)
                optimizer.step()
                train_s += clock() - ts
                if stats is None:
                    stats = {"loss": float(loss.detach())}
                missing = [k for k in sums if k not in stats]
                if missing:
                    raise ValueError(f"the step function returned no {missing}: return (loss, stats) with them, or "
                                     f"pass running= the names it returns ({sorted(stats)})")
                w = 1 if batch_weight is None else batch_weight(batch)
                for k in sums:
                    sums[k] += float(stats[k]) * w
                weight_sum += w
                step += 1
                n_batches += 1
                bar.update(1)
                if progress:
                    bar.set_postfix({k: f"{float(v):.3f}" for k, v in stats.items()}, refresh=False)
                if every and step % every == 0 and record():
                    stopped_by = "patience"
                    break
            if stopped_by is not None:
                break
            epoch += 1
            if per_epoch and record():
                stopped_by = "patience"
        if stopped_by == "patience":  # patience ran out just as a budget was spent: the budget stopped it
            stopped_by = budget.spent(step, epoch, clock() - t0) or "patience"
        if not curve or curve[-1]["step"] != step:
            record()
    finally:
        bar.close()
    if best_state is not None:
        with torch.no_grad():
            for k, t in keep_best.items():
                t.copy_(best_state[k])
    return FitResult(curve=curve, steps=step, epochs=epoch, stopped_by=stopped_by, best_index=best_index,
                     restored=best_state is not None, wall_s=clock() - t0, train_s=train_s)
