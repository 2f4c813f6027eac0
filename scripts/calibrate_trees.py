"""Calibrate the draft trees of one drafter and write them beside the model: ``<model>/trees/<drafter>.json``.

The same calibration as notebook 04 (which writes ``trees/heads.json`` with ``-p write_trees True``): the model's
shipped ``calibration`` split, codes 1..15 re-sampled from p at the deployed sampling
(:func:`rvqspec_lib.eval.calibration.calibration_frames`), then :func:`rvqspec_lib.eval.calibration.calibrate` for
every node budget 2..64 with the notebook's draws and seed.
The trees depend on the drafter that proposes the codes, so each drafter has its own file: ``rvqspec synth
--decoder paper`` reads ``trees/offsets.json``, ``--decoder tree:calibrated:N`` reads ``trees/heads.json`` (and
``tree:calibrated:N@offsets`` the offsets' file).

    python scripts/calibrate_trees.py --model embedded --drafter offsets [--frames 1500] [--draws 2] [--seed 0]

This is the command that error messages name when a shipped calibration file is missing or damaged.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded", help="embedded or a model folder with a calibration split")
    ap.add_argument("--drafter", default="heads", help="heads, or a drafter shipped in <model>/drafters/")
    ap.add_argument("--frames", type=int, default=1500, help="calibration frames (the shipped trees/heads.json: 1500)")
    ap.add_argument("--draws", type=int, default=2, help="Monte Carlo draws of the sampled children (notebook 04: 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="default <model>/trees/<drafter>.json")
    a = ap.parse_args(argv)

    import torch

    from rvqspec_lib.common.provenance import provenance
    from rvqspec_lib.eval.calibration import BUDGETS, calibrate, calibration_frames
    from rvqspec_lib.models.frame import inner_sampling
    from rvqspec_lib.models.drafter_files import check_shipped_drafter, shipped_drafter
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.models.tree_files import save_calibration, tree_file

    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out) if a.out else tree_file(a.model, a.drafter)
    if out is None:
        print(f"error: {a.model} has no folder to hold calibrated trees: give --out", file=sys.stderr)
        return 2
    try:
        check_shipped_drafter(a.model, a.drafter)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lm = load_model(a.model)
    cp = lm.code_predictor
    drafter = shipped_drafter(lm, a.drafter, cp)
    sampling = inner_sampling(lm)
    t0 = time.perf_counter()
    frames = calibration_frames(lm, max_frames=a.frames, seed=a.seed)
    cal = calibrate(cp, drafter, frames, sampling=sampling, budgets=BUDGETS, draws=a.draws, seed=a.seed)
    secs = time.perf_counter() - t0
    params = dict(model=a.model, drafter=a.drafter, n_calibration_frames=a.frames, draws=a.draws, seed=a.seed,
                  threads=torch.get_num_threads(), budgets=list(BUDGETS), script="scripts/calibrate_trees.py",
                  settings_as="notebook 04 (trees/heads.json)", seconds=round(secs, 1))
    cal["provenance"] = provenance(params, seed=a.seed)
    save_calibration(cal, out)
    print(f"calibrated the {a.drafter} trees on {cal['n_frames']} frames in {secs:.0f} s -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
