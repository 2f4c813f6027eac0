"""``rvqspec prepare``: make a checkpoint ready for the paper's decoder (docs/cli.md#rvqspec-prepare): the model
speaks its calibration frames, the offsets are trained, the trees of every drafter calibrated and ``--decoder auto``
timed; each stage skips when its output is complete, so a second run (or one after Ctrl-C) resumes. The work is
:func:`rvqspec_lib.training.prepare.prepare`; this module adds the flags, the checks before loading and the report.
"""

from __future__ import annotations

import argparse
import sys
import time

from rvqspec_lib.cli.args import add_device
from rvqspec_lib.cli.common import add_threads_arg, check_device

HELP = "get a checkpoint ready for --decoder paper and auto: speak frames, train the offsets, calibrate, time auto"
#: ``--stages`` values, in order (:data:`rvqspec_lib.training.prepare.STAGES`; kept here so --help needs no torch).
STAGES = ("speak", "offsets", "trees", "auto")


def add_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``rvqspec prepare`` (light: no torch)."""
    p.add_argument("--model", required=True, help="a checkpoint folder or hub id (e.g. "
                   "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice), or embedded")
    p.add_argument("--frames", type=int, default=1500, metavar="N",
                   help="calibration frames the model speaks (the offsets train on as many, validate on a fifth; "
                        "default 1500)")
    add_device(p)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the model's dtype while preparing (auto: its own where the device runs it well, else "
                        "float32; docs/model.md#device-and-dtype)")
    p.add_argument("--auto-dtype", action="append", choices=["float32", "bfloat16"], dest="auto_dtypes",
                   help="a synth --dtype to time --decoder auto for (repeat for several; default float32, synth's)")
    p.add_argument("--stages", default=",".join(STAGES),
                   help=f"comma-separated stages to run, in order (default all: {','.join(STAGES)})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write what each stage did here (JSON)")
    add_threads_arg(p)


def check_args(args) -> list[str]:
    """Every check that needs no model; returns the stages. Raises ValueError (one line naming the flag)."""
    if args.frames < 1:
        raise ValueError(f"--frames must be >= 1 (calibration frames of 80 ms), got {args.frames}")
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise ValueError(f"--stages {args.stages!r}: choose among {','.join(STAGES)}")
    check_device(args)  # a device not present: one line, before loading
    return stages


def run(args, threads: int) -> int:
    """Run ``prepare`` on parsed flags. Returns the exit status.

    Raises:
        ValueError, FileNotFoundError: bad input (one line from ``main``, exit status 2).
    """
    started = getattr(args, "_started", None) or time.perf_counter()
    stages = check_args(args)
    from rvqspec_lib.cli.common import apply_threads, note, threads_text
    from rvqspec_lib.common.files import write_json_atomic
    from rvqspec_lib.models import loader
    from rvqspec_lib.models.drafter_files import model_drafter_dir
    from rvqspec_lib.training.prepare import prepare

    facts = loader.model_facts(args.model)  # a folder that is not a checkpoint: one line, before loading
    if facts is not None and facts.kind in ("tiny-random", "random-size"):
        raise ValueError(f"{args.model} has random weights built in memory and no folder to prepare: give a "
                         "checkpoint folder, a hub id or embedded")
    threads = apply_threads(threads)
    t = time.perf_counter()
    lm = loader.load_model(args.model, device=args.device, dtype=args.dtype)
    load_s = time.perf_counter() - t
    folder = model_drafter_dir(lm)
    if lm.is_random:
        note(f"{args.model} has RANDOM weights: what prepare makes is for timing only")
    if folder is not None and lm.folder is not None and folder != lm.folder:
        note(f"{lm.folder} cannot be written: preparing into the cache folder {folder}")
    done = prepare(lm, frames=args.frames, seed=args.seed, auto_dtypes=args.auto_dtypes or ["float32"],
                   stages=stages, progress=sys.stderr.isatty())
    total_s = time.perf_counter() - started
    if args.json:
        write_json_atomic(args.json, {"model": args.model, **done.to_json(), "threads": threads, "load_s": load_s,
                                      "total_s": total_s})
    ran = [s.stage for s in done.stages if not s.skipped]
    print(f"prepared {args.model} in {done.folder} on {done.device} ({done.dtype}): ran "
          f"{', '.join(ran) or 'nothing (every stage complete)'} | load {load_s:.1f} s, total {total_s:.1f} s | "
          f"{threads_text(threads)}")
    print(f"now: rvqspec synth --model {args.model} --decoder paper (or auto, or --stream) --text ...")
    return 0
