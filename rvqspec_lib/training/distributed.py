"""Past one machine: frame extraction (a shard per process) and drafter training (gradients summed before each step,
so every process takes the single-process step), data-parallel over ``accelerate launch`` processes (gloo on CPUs).
:class:`Parallel` wraps ``accelerate.PartialState`` and ``torch.distributed``; with one process it does nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from accelerate import PartialState

from rvqspec_lib.common.files import write_json_atomic
from rvqspec_lib.data.frame_choice import SHARD_INDEX as INDEX
from rvqspec_lib.data.frame_sources import frames_from_dataset, frames_from_utterances, load_split
from rvqspec_lib.data.frames import Frames

SHARD_PATTERN = "frames-{rank:05d}-of-{world:05d}.safetensors"


@dataclass
class Parallel:
    """The processes of a data-parallel run: this one's ``rank`` (0 = main) of ``world``, on ``device``."""

    rank: int = 0
    world: int = 1
    device: str = "cpu"

    @classmethod
    def detect(cls) -> "Parallel":
        """The processes ``accelerate launch`` (or ``torchrun``) started this one among; a plain run is one."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls()
        s = PartialState()
        return cls(int(s.process_index), int(s.num_processes), str(s.device))

    @property
    def is_main(self) -> bool:
        """Rank 0."""
        return self.rank == 0

    def block(self, n: int) -> tuple[int, int]:
        """This process's contiguous block ``[start, stop)`` of ``n`` items (:func:`shard_range`)."""
        return shard_range(n, self.rank, self.world)

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over processes, in place (a CPU tensor through the device under NCCL)."""
        if self.world > 1:
            if t.device.type == "cpu" and torch.distributed.get_backend() == "nccl":
                u = t.to(self.device)
                torch.distributed.all_reduce(u)
                t.copy_(u.cpu())
            else:
                torch.distributed.all_reduce(t)
        return t

    def gather(self, obj) -> list:
        """Every process's ``obj``, in rank order, on every process."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait for every process (nothing with one process)."""
        if self.world > 1:
            torch.distributed.barrier()

    def summed_gradients(self, optimizer: torch.optim.Optimizer, parameters: Sequence[torch.Tensor]):
        """``optimizer`` whose ``step()`` first sums the gradients of ``parameters`` over processes in a fixed order
        (a missing gradient counts as zero), so every process issues the same collectives whatever its graph."""
        return optimizer if self.world == 1 else _SummedGradients(optimizer, list(parameters), self)


class _SummedGradients:
    """:meth:`Parallel.summed_gradients`' optimiser (``param_groups`` and ``zero_grad``: the wrapped one's)."""

    def __init__(self, optimizer, parameters, parallel: Parallel):
        self.optimizer, self.parameters, self.parallel = optimizer, parameters, parallel

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self):
        """Sum the gradients over processes, then the wrapped optimiser's step."""
        for p in self.parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.parallel.all_reduce_(p.grad)
        return self.optimizer.step()


def shard_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """Contiguous block ``[start, stop)`` of ``n`` items for ``rank`` of ``world``, tiling ``[0, n)`` in rank order
    (the first ``n % world`` one larger). Raises ValueError: ``world < 1``, ``rank`` outside it, ``n < 0``."""
    if world < 1 or not 0 <= rank < world or n < 0:
        raise ValueError(f"need 0 <= rank < world and n >= 0, got rank={rank}, world={world}, n={n}")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _write_shard(make, out_dir, par: Parallel, n: int, what: str) -> Path:
    """``make(start, stop)``'s frames of this process's block of ``n`` items (``what``: ``utterance`` or ``row``), ids
    made GLOBAL, written as this process's shard, then (main process, once every shard is written) ``index.json``."""
    if n < par.world:
        raise ValueError(f"{n} {what}(s) for {par.world} processes: give at least one {what} per process")
    start, stop = par.block(n)
    fr = make(start, stop)
    fr.utterance = fr.utterance + start
    fr.source = {**fr.source, "shard": par.rank, "shards": par.world, what + "s": [start, stop]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fr.save(out / SHARD_PATTERN.format(rank=par.rank, world=par.world))
    sizes = par.gather(len(fr))
    par.barrier()
    if par.is_main:
        write_json_atomic(out / INDEX, {"format": "rvqspec-frame-shards", "world": par.world, "n_utterances": n,
                                        "frames": sizes, "shards": [SHARD_PATTERN.format(rank=r, world=par.world)
                                                                    for r in range(par.world)]})
    par.barrier()
    return out


def extract_frames(lm, utterances: Sequence, out_dir: str | os.PathLike, *, parallel: Parallel | None = None,
                   batch_size: int = 8, progress: bool = False, source: dict | None = None) -> Path:
    """Teacher-forced frames of ``utterances`` (the same list on every process), each process its block, written to
    ``out_dir`` as :data:`SHARD_PATTERN` shards and ``index.json``; utterance ids are GLOBAL input indices. ``lm`` on
    ``parallel.device`` (default :meth:`Parallel.detect`); ``batch_size`` utterances a talker pass. Returns
    ``out_dir``. Raises ValueError: more processes than utterances."""
    return _write_shard(lambda start, stop: frames_from_utterances(
        lm, list(utterances[start:stop]), batch_size=batch_size, progress=progress, source=source),
        out_dir, parallel or Parallel.detect(), len(utterances), "utterance")


def extract_dataset_frames(dataset, lm, codec, out_dir: str | os.PathLike, *, parallel: Parallel | None = None,
                           language: str = "auto", max_items: int | None = None, progress: bool = False) -> Path:
    """:func:`extract_frames` over the first ``max_items`` rows of an audio + text dataset through
    :func:`~rvqspec_lib.data.frame_sources.frames_from_dataset` (arguments as there); ids are GLOBAL row indices.
    Raises FileNotFoundError: no such folder; ValueError: missing columns, fewer rows than processes, bad codes."""
    dataset = load_split(dataset)
    n = len(dataset) if max_items is None else min(int(max_items), len(dataset))
    return _write_shard(lambda start, stop: frames_from_dataset(
        dataset.select(range(start, stop)), lm, codec, language=language, progress=progress),
        out_dir, parallel or Parallel.detect(), n, "row")


def load_frame_shards(out_dir: str | os.PathLike, *, rank: int | None = None) -> Frames:
    """Frames written by :func:`extract_frames`: every shard in rank order (``rank=None``), or one. Raises
    FileNotFoundError: no ``index.json`` (extraction did not finish) or a missing shard."""
    d = Path(out_dir)
    idx = d / INDEX
    if not idx.is_file():
        raise FileNotFoundError(f"no {idx}: extract frames first (rvqspec_lib.training.distributed.extract_frames; "
                                "the main process writes it when every shard is done)")
    index = json.loads(idx.read_text())
    names = index["shards"] if rank is None else [index["shards"][rank]]
    parts = [Frames.load(d / nm) for nm in names]
    out = Frames.cat(parts, keep_ids=True)  # the global ids, not Frames.cat's renumbering
    out.source = {**parts[0].source, "shards": index["world"], "n_utterances": index["n_utterances"]}
    out.source.pop("shard", None)
    return out
