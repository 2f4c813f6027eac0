"""``rvqspec train-drafter``: train position-aware offsets or Medusa heads on teacher-forced frames (paper Table 2;
docs/methods.md); the drafter, its ``.json`` and its ``.curve.json`` training curve are written atomically."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rvqspec_lib.cli.common import check_outputs, load, note_fewer_frames, timings
from rvqspec_lib.common.files import write_json_atomic
from rvqspec_lib.data.frame_choice import FrameSource
from rvqspec_lib.decoding.drafters import DEFAULT_K
from rvqspec_lib.models.drafter_files import drafter_path, make_drafter, model_drafter_dir, save_drafter
from rvqspec_lib.models.frame import inner_sampling
from rvqspec_lib.training import drafters


def check_out(args, out: Path) -> None:
    """The drafter file ``out`` of train-drafter and train-drafter-parallel: a new ``.safetensors`` file (or
    ``--force``). Raises ValueError (one line)."""
    if out.suffix != ".safetensors":
        raise ValueError(f"--out must end in .safetensors, got {out}")
    if out.exists() and not args.force:
        raise ValueError(f"{'--out ' * bool(args.out)}{out} exists (a drafter shipped or trained before): pass "
                         "--force to replace it, or choose another --out")


def trained(args, lm, frames, val, **kwargs):
    """A fresh ``--drafter`` (``--K``) trained on ``frames`` (``val``: validation frames, else ``--val-fraction``)
    with the flags of train-drafter and train-drafter-parallel; ``kwargs``: more of
    :func:`~rvqspec_lib.training.drafters.train_drafter`'s. Returns its result."""
    drafter = make_drafter(args.drafter, lm.code_predictor, fresh=True, K=DEFAULT_K if args.K is None else args.K)
    return drafters.train_drafter(drafter.to(lm.device), lm.code_predictor, frames, val, loss=args.loss,
                                  sampling=inner_sampling(lm), lr=args.lr, batch_size=args.batch_size,
                                  max_epochs=args.epochs, patience=args.patience,
                                  val_fraction=args.val_fraction or 0.1, seed=args.seed, **kwargs)


def run(args, threads: int) -> int:
    """``rvqspec train-drafter``: the contract of :data:`~rvqspec_lib.cli.main.COMMANDS`."""
    t0 = args._started  # main records when the command started
    d = model_drafter_dir(args.model)
    if not args.out and d is None:
        raise ValueError("--out is required when --model is not a local checkpoint directory")
    out = Path(args.out) if args.out else drafter_path(d, args.drafter)
    check_out(args, out)
    source = FrameSource.of(args)
    if source.shipped and args.val_fraction is not None:
        raise ValueError("--val-fraction is not used here: validation frames come from the shipped validation "
                         "split (set their number with --val-frames)")
    if not source.shipped and args.val_frames is not None:
        raise ValueError("--val-frames is used only with the shipped utterances of an embedded model; here "
                         "validation is --val-fraction of the utterances")
    k = DEFAULT_K if args.K is None else args.K
    curve = Path(args.curve_json) if args.curve_json else out.with_suffix(".curve.json")
    if out.parent.exists():  # else the default file goes into a new drafters/ folder, made by save_drafter
        check_outputs([(out, "--out"), (out.with_suffix(".json"), "--out (its .json description)"),
                       (curve, "--curve-json")])

    def check_k(model) -> None:
        if not 1 <= k <= model.n_code_groups - 2:
            raise ValueError(f"K={k} is out of range for a code predictor of {model.n_code_groups - 1} codes: --K "
                             f"1..{model.n_code_groups - 2} (the paper uses 3)")
    lm, threads, load_s = load(args, threads, "the drafter learns nothing meaningful", check=check_k, dtype=args.dtype)
    frames = source.load(lm, "training")
    note_fewer_frames(frames, args.frames)
    val_frames = 500 if args.val_frames is None else args.val_frames
    val = source.load(lm, "validation", val_frames) if source.shipped else None
    if val is not None:
        note_fewer_frames(val, val_frames, "--val-frames")
    t = time.perf_counter()
    res = trained(args, lm, frames, val, progress=sys.stderr.isatty())
    train_s = time.perf_counter() - t
    res.drafter.provenance.update(model=args.model, threads=threads, device=lm.device, model_dtype=lm.dtype)
    save_drafter(res.drafter, out)  # the drafter and its .json, atomically; then its curve
    write_json_atomic(curve, res.to_json())
    c0, cb = res.curve[0], res.curve[res.best_epoch]
    print(f"{args.drafter} ({res.drafter.params_added:,} parameters, loss {args.loss}): validation loss "
          f"{c0['val_loss']:.4f} -> {cb['val_loss']:.4f}, exact acceptance by offset "
          f"{[round(a, 3) for a in c0['val_acceptance_by_offset']]} -> "
          f"{[round(a, 3) for a in cb['val_acceptance_by_offset']]} (epoch {res.best_epoch}) | {lm.device} "
          f"({lm.dtype}) | {timings(threads, load=load_s, train=train_s, total=time.perf_counter() - t0)}")
    print(f"wrote {out}, {out.with_suffix('.json')} and {curve}")
    return 0
