"""``rvqspec eval-acceptance``: tokens per call and exact acceptance of a drafter (reused heads, offsets, Medusa)
under chain windows and a tree (paper Table 2; docs/methods.md)."""

from __future__ import annotations

import time

from rvqspec_lib.cli.common import check_tree_ranks, load, note, note_fewer_frames, timings, write_json
from rvqspec_lib.common.provenance import provenance
from rvqspec_lib.data.frame_choice import FrameSource
from rvqspec_lib.decoding.decoder_names import parse_decoder_name
from rvqspec_lib.decoding.decoders import CHAIN_WINDOWS
from rvqspec_lib.eval import acceptance
from rvqspec_lib.models.drafter_files import make_drafter, model_drafter_dir
from rvqspec_lib.models.frame import inner_sampling
from rvqspec_lib.models.named_decoders import resolve


def decoder_names(decoder: str | None) -> list:
    """The decoder names evaluated: ``--decoder`` (a chain or a tree of rank paths), or chain windows 2..8 and the
    default tree. Raises ValueError (one line): any other name, a window outside 2..8, malformed rank paths."""
    if decoder is None:
        return [parse_decoder_name(f"chain:{w}") for w in CHAIN_WINDOWS] + [parse_decoder_name("tree")]
    name = parse_decoder_name(decoder)
    if name.kind not in ("chain", "tree") or name.best_window or name.drafter != "heads":
        raise ValueError(f"--decoder {name.text}: eval-acceptance takes chain[:N] or tree[:PATHS] (the drafter is "
                         "--drafter); calibrated trees are evaluated by notebook 04 and `rvqspec eval-wer`")
    return [name]


def run(args, threads: int) -> int:
    """``rvqspec eval-acceptance``: the contract of :data:`~rvqspec_lib.cli.main.COMMANDS`."""
    t0 = args._started  # main records when the command started
    source = FrameSource.of(args)
    names = decoder_names(args.decoder)
    if args.drafter == "heads" and args.drafter_path:
        raise ValueError("--drafter-path is not used with --drafter heads (reused heads have no file)")
    lm, threads, load_s = load(args, threads, dtype=args.dtype,
                               check=lambda m: check_tree_ranks(names, m.codebook_size, args.max_rank))
    drafter = make_drafter(args.drafter, lm.code_predictor, args.drafter_path or model_drafter_dir(args.model))
    frames = source.load(lm, "evaluation")
    note_fewer_frames(frames, args.frames)
    decoders = [resolve(n, lm).decoder for n in names]  # they draft with --drafter (passed beside them)
    t = time.perf_counter()
    res = acceptance.evaluate_acceptance(lm.code_predictor, drafter, frames, decoders=decoders,
                                         sampling=inner_sampling(lm), seed=args.seed, max_rank=args.max_rank,
                                         teacher_codes=args.teacher_codes)
    eval_s = time.perf_counter() - t
    if lm.is_random:  # after the work: an error is the only line
        note(f"{args.model} has RANDOM weights: acceptance rates mean nothing")
    params = {**{k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)},
              "decoder_name": [n.label for n in names]}
    res = {"model": args.model, "random_weights": lm.is_random, "device": lm.device, "model_dtype": lm.dtype, **res,
           "frames": frames.source, "threads": threads, "load_s": load_s, "eval_s": eval_s,
           "total_s": time.perf_counter() - t0, "provenance": provenance(params, seed=args.seed)}
    print(f"drafter {args.drafter}: {res['params_added']:,} parameters added, {res['n_frames']} frames | {lm.device} "
          f"({lm.dtype}) | {timings(threads, load=load_s, evaluation=eval_s, total=res['total_s'])}")
    for label, tpc in res["tokens_per_call"].items():
        print(f"  {label:7s} {tpc:.3f} tokens/call (predicted from the exact tables "
              f"{res['predicted_tokens_per_call'][label]:.3f})")
    alpha = enumerate(res["exact"]["alpha_by_offset"])
    print(f"  exact acceptance by offset: {', '.join(f'j={j + 1} {a:.3f}' for j, a in alpha if a is not None)}")
    write_json(args.json, res)
    return 0
