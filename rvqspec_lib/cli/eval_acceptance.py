"""``rvqspec eval-acceptance``: tokens per call and exact acceptance of a drafter (reused heads, offsets, Medusa)
under chain windows and a tree (paper Table 2; docs/methods.md). Flags, decoders, ranks and the frame source are
checked before the model loads; the JSON is written atomically.
"""

from __future__ import annotations

import argparse
import json
import time

from rvqspec_lib.cli.common import (
    TREE_HELP,
    WINDOW_HELP,
    add_threads_arg,
    apply_threads,
    check_tree_ranks,
    note,
    threads_text,
)
from rvqspec_lib.cli.frames import (
    add_frame_source_args,
    check_frame_source_args,
    drafter_model_dir,
    frames_from_args,
    note_fewer_frames,
)
from rvqspec_lib.decoding.decoders import CHAIN_WINDOWS

_WINDOWS = f"{CHAIN_WINDOWS[0]}..{CHAIN_WINDOWS[-1]}"


def add_args(p: argparse.ArgumentParser) -> None:
    """The ``eval-acceptance`` flags."""
    p.add_argument("--model", required=True, help="embedded, tiny-random, a checkpoint dir or a hub id")
    p.add_argument("--drafter", default="heads", choices=["heads", "offsets", "medusa"],
                   help="drafter to evaluate (default heads: the reused LM heads, nothing to load)")
    p.add_argument("--drafter-path", help="drafter file (default <model_dir>/drafters/<drafter>.safetensors; "
                                          "embedded: data/embedded/model/drafters/)")
    p.add_argument("--decoder", choices=["chain", "tree"],
                   help=f"one decoder (default: chain windows {_WINDOWS} and the tree)")
    p.add_argument("--window", type=int, default=None, help=WINDOW_HELP + "; with --decoder chain")
    p.add_argument("--tree", default=None, help=TREE_HELP + "; with --decoder tree or no --decoder")
    p.add_argument("--max-rank", type=int, default=8, help="ranks tabulated for the tree calibration")
    p.add_argument("--teacher-codes", choices=["decoded", "frames"], default="decoded",
                   help="codes the exact tables teacher-force: decoded (samples of p) or the frames' own")
    p.add_argument("--json", help="write every statistic here")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    add_frame_source_args(p, default_frames=200)
    add_threads_arg(p)


def decoders_from_args(args) -> list:
    """One decoder (--decoder chain / tree) or the sweep: chain windows 2..8 and the tree.

    Raises:
        ValueError: a flag the chosen decoder does not use, a window outside 2..8, a malformed tree.
    """
    if args.window is not None and args.decoder != "chain":
        raise ValueError(f"--window is used only with --decoder chain (without --decoder, windows {_WINDOWS} are all "
                         "run)")
    if args.tree is not None and args.decoder == "chain":
        raise ValueError("--tree is not used with --decoder chain: drop it, or use --decoder tree")
    from rvqspec_lib.decoding.decoder_names import is_calibrated_name, parse_decoder_name

    if args.decoder == "chain":
        return [parse_decoder_name("chain" if args.window is None else f"chain:{args.window}").decoder()]
    if is_calibrated_name(args.tree) or "@" in (args.tree or ""):
        raise ValueError(f"--tree {args.tree}: eval-acceptance takes rank paths (e.g. '0;1;0,0'); calibrated trees "
                         "are evaluated by notebook 03 and `rvqspec eval-wer`")
    tree = parse_decoder_name("tree" if args.tree is None else f"tree:{args.tree}").decoder()
    if args.decoder == "tree":
        return [tree]
    return [parse_decoder_name(f"chain:{w}").decoder() for w in CHAIN_WINDOWS] + [tree]


def _check_ranks(args, decoders, codebook_size: int) -> None:
    if args.max_rank > codebook_size:
        raise ValueError(f"--max-rank {args.max_rank} exceeds the codebook ({codebook_size} codes)")
    check_tree_ranks(decoders, codebook_size)


def run(args, threads: int) -> int:
    """Run ``eval-acceptance`` on parsed flags. Returns the exit status.

    Raises:
        ValueError, FileNotFoundError: bad input (one line from ``main``, exit status 2).
    """
    started = getattr(args, "_started", None) or time.perf_counter()
    check_frame_source_args(args)
    decoders = decoders_from_args(args)
    if args.drafter == "heads" and args.drafter_path:
        raise ValueError("--drafter-path is not used with --drafter heads (reused heads have no file)")
    if args.max_rank < 1:
        raise ValueError(f"--max-rank must be >= 1, got {args.max_rank}")

    from rvqspec_lib.models.loader import load_model, model_facts

    facts = model_facts(args.model)
    if facts is not None:
        _check_ranks(args, decoders, facts.codebook_size)

    threads = apply_threads(threads)  # after the cheap checks: torch loads here
    from rvqspec_lib.common.files import write_text_atomic
    from rvqspec_lib.common.provenance import provenance
    from rvqspec_lib.eval.acceptance import evaluate_acceptance
    from rvqspec_lib.models.drafter_files import make_drafter
    from rvqspec_lib.decoding.sampling import Sampling

    t = time.perf_counter()
    lm = load_model(args.model, dtype=args.dtype)
    load_s = time.perf_counter() - t
    _check_ranks(args, decoders, lm.codebook_size)
    path = args.drafter_path or drafter_model_dir(args.model)
    drafter = make_drafter(args.drafter, lm.code_predictor, path)
    frames = frames_from_args(args, lm, "evaluation")
    note_fewer_frames(frames, args.frames)
    sampling = Sampling.from_generation_config(lm.generation or {}, loop="code_predictor")
    t = time.perf_counter()
    res = evaluate_acceptance(lm.code_predictor, drafter, frames, decoders=decoders, sampling=sampling,
                              seed=args.seed, max_rank=args.max_rank, teacher_codes=args.teacher_codes)
    eval_s = time.perf_counter() - t
    if lm.is_random:
        note(f"{args.model} has RANDOM weights: acceptance rates mean nothing")
    params = {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)}
    res = {"model": args.model, "random_weights": lm.is_random, **res, "frames": frames.source, "threads": threads,
           "load_s": load_s, "eval_s": eval_s, "total_s": time.perf_counter() - started,
           "provenance": provenance(params, seed=args.seed)}
    print(f"drafter {args.drafter}: {res['params_added']:,} parameters added, {res['n_frames']} frames | load "
          f"{load_s:.1f} s, evaluation {eval_s:.1f} s, total {res['total_s']:.1f} s | {threads_text(threads)}")
    for label, tpc in res["tokens_per_call"].items():
        pred = res["predicted_tokens_per_call"][label]
        print(f"  {label:7s} {tpc:.3f} tokens/call (predicted from the exact tables {pred:.3f})")
    alpha = res["exact"]["alpha_by_offset"]
    shown = ", ".join(f"j={j + 1} {a:.3f}" for j, a in enumerate(alpha) if a is not None)
    print(f"  exact acceptance by offset: {shown}")
    if args.json:
        write_text_atomic(args.json, json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
