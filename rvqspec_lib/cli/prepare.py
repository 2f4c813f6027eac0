"""``rvqspec prepare``: make a checkpoint ready for the paper's decoder (docs/cli.md#rvqspec-prepare): the model
speaks its calibration frames, the offsets are trained, the trees of every drafter calibrated and ``--decoder auto``
timed; each stage skips when its output is complete, so a second run resumes (:mod:`rvqspec_lib.training.prepare`)."""

from __future__ import annotations

import sys
import time

from rvqspec_lib.cli.args import STAGES
from rvqspec_lib.cli.common import load, note, timings, write_json
from rvqspec_lib.models import loader
from rvqspec_lib.models.drafter_files import model_drafter_dir
from rvqspec_lib.training.prepare import prepare


def run(args, threads: int) -> int:
    """``rvqspec prepare``: the contract of :data:`~rvqspec_lib.cli.main.COMMANDS`."""
    t0 = args._started  # main records when the command started
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if not stages or any(s not in STAGES for s in stages):
        raise ValueError(f"--stages {args.stages!r}: choose among {','.join(STAGES)}")
    facts = loader.model_facts(args.model)  # a folder that is not a checkpoint: one line, before loading
    if facts is not None and facts.kind in ("tiny-random", "random-size"):
        raise ValueError(f"{args.model} has random weights built in memory and no folder to prepare: give a "
                         "checkpoint folder, a hub id or embedded")
    lm, threads, load_s = load(args, threads, "what prepare makes is for timing only", dtype=args.dtype)
    folder = model_drafter_dir(lm)
    if folder is not None and lm.folder is not None and folder != lm.folder:
        note(f"{lm.folder} cannot be written: preparing into the cache folder {folder}")
    done = prepare(lm, frames=args.frames, seed=args.seed, auto_dtypes=args.auto_dtypes, stages=stages,
                   progress=sys.stderr.isatty())  # auto_dtypes None: a default synth's dtype here
    total_s = time.perf_counter() - t0
    write_json(args.json, {"model": args.model, **done.to_json(), "threads": threads, "load_s": load_s,
                           "total_s": total_s})
    ran = [s.stage for s in done.stages if not s.skipped]
    print(f"prepared {args.model} in {done.folder} on {done.device} ({done.dtype}): ran "
          f"{', '.join(ran) or 'nothing (every stage complete)'} | {timings(threads, load=load_s, total=total_s)}")
    if done.auto_cached:
        print(f"now: rvqspec synth --model {args.model} --text ... takes the fastest path timed here (or --decoder "
              "paper, --stream)")
    else:  # the auto stage not asked for, or its timing was disturbed (an oversubscribed choice is never cached)
        print(f"now: rvqspec synth --model {args.model} --text ... runs untimed (AR through native where it can) until "
              f"`rvqspec prepare --model {args.model} --stages auto` caches a timed choice (run it on a quiet "
              "machine); --decoder paper and --stream work now")
    return 0
