"""``rvqspec train-drafter-parallel``: train a drafter on frame shards, data-parallel under ``accelerate launch``
(docs/cli.md#rvqspec-extract-frames-and-train-drafter-parallel): the same optimiser steps as one process; the main
process writes the drafter, its JSON and its training curve."""

from __future__ import annotations

import sys
from pathlib import Path

from rvqspec_lib.cli.common import load, parallel_device
from rvqspec_lib.cli.main import accelerate_main
from rvqspec_lib.cli.train_drafter import check_out, trained
from rvqspec_lib.data.frame_choice import check_frames_path
from rvqspec_lib.data.frames import Frames
from rvqspec_lib.models.drafter_files import save_drafter
from rvqspec_lib.training.distributed import load_frame_shards


def _frames(path: str) -> Frames:
    return load_frame_shards(Path(path)) if Path(path).is_dir() else Frames.load(path)


def run(args, threads: int) -> int:
    """``rvqspec train-drafter-parallel`` in this process, one of several under ``accelerate launch``."""
    check_out(args, Path(args.out))
    for flag, path, split in (("--frames", args.frames, "training"), ("--val-frames", args.val_frames, "validation")):
        problem = check_frames_path(path, flag, f"rvqspec extract-frames --model {args.model} --split {split}")
        if problem:
            raise ValueError(problem)
    par = parallel_device(args)
    lm = load(args, threads)[0]
    train = _frames(args.frames)
    val = _frames(args.val_frames) if args.val_frames else None
    res = trained(args, lm, train, val, progress=sys.stderr.isatty() and par.is_main,
                  curve_path=Path(args.out).with_suffix(".curve.json"), parallel=par)
    if par.is_main:
        res.drafter.provenance.update(model=args.model, device=lm.device, model_dtype=lm.dtype)
        save_drafter(res.drafter, Path(args.out))
        c0, cb = res.curve[0], res.curve[res.best_epoch]
        print(f"{args.drafter} on {par.world} process(es) on {lm.device} ({lm.dtype}): validation acceptance "
              f"{[round(a, 4) for a in c0['val_acceptance_by_offset']]} -> "
              f"{[round(a, 4) for a in cb['val_acceptance_by_offset']]} (epoch {res.best_epoch}); wrote {args.out}")
    par.barrier()
    return 0


#: ``python -m rvqspec_lib.cli.train_drafter_parallel`` (``accelerate launch -m`` runs it).
main = accelerate_main("train-drafter-parallel")

if __name__ == "__main__":
    sys.exit(main())
