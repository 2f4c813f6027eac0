"""``rvqspec bench`` (and ``make bench``): per-call latency of the talker step and of code-predictor calls with
Q query positions, printed as a table with device, dtype and thread count, and optionally written as JSON with its
provenance. The timing itself is :func:`rvqspec_lib.eval.bench.bench_model` (method: docs/style.md#benchmarks).
"""

from __future__ import annotations

import argparse
import time

from rvqspec_lib.cli.common import add_threads_arg, apply_threads
from rvqspec_lib.eval.bench import DEFAULT_QUERY_SIZES

#: ``--backend`` values: rvqspec_lib.eval.export_timing.BACKENDS, repeated here so that the parser does not import
#: torch (tests/test_export_cli.py checks that the two agree).
BACKENDS = ("eager", "compile", "onnx", "coreml", "cuda")

#: Largest --queries value: a verify call over more nodes is not a draft tree.
MAX_QUERIES = 1024


def _int_list(s: str) -> list[int]:
    try:
        vals = [int(v) for v in s.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench`` options to ``parser`` (the ``bench`` sub-parser of ``rvqspec``). Returns the parser.

    Options: ``--model`` (default ``qwen3-tts-0.6b-random``), ``--json PATH``, ``--repeats``, ``--warmup``,
    ``--threads``, ``--queries 1,2,4,...``, ``--prefix-len``, ``--talker-context``, ``--dtype``, ``--device``,
    ``--seed``, ``--no-progress``, ``--backend NAME``.
    """
    parser.add_argument("--model", default="qwen3-tts-0.6b-random",
                        help="tiny-random, qwen3-tts-0.6b-random, qwen3-tts-1.7b-random, a checkpoint dir or hub id")
    parser.add_argument("--json", dest="json_path", default=None, help="write the full result (+ provenance) here")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before each measurement")
    add_threads_arg(parser)
    parser.add_argument("--queries", type=_int_list, default=list(DEFAULT_QUERY_SIZES),
                        help="query positions per code-predictor call, comma-separated (default "
                             f"{','.join(map(str, DEFAULT_QUERY_SIZES))}; at most {MAX_QUERIES})")
    parser.add_argument("--prefix-len", type=int, default=8, help="KV prefix of the code-predictor call")
    parser.add_argument("--talker-context", type=int, default=64, help="KV prefix of the talker step")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"],
                        help="weights and activations (float16 for GPUs)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    parser.add_argument("--decoders", default=None,
                        help="with --backend: comma-separated decoder names (rvqspec synth --help lists them: ar, "
                             "chain:N, tree[:PATHS], tree:calibrated[-point-mass|-sampled]:N[@DRAFTER], paper[:N], "
                             "...; default AR, chain:4, the default tree, and when the model ships them "
                             "tree:calibrated:4 and paper, the paper's decoder)")
    parser.add_argument("--backend", default=None, help="instead of call latencies: frame times of AR, the fused AR "
                        "frame, Chain(4) and the trees through one verify backend (eager, compile, onnx, cuda), "
                        "one interleaved run (rvqspec_lib.eval.export_timing.bench_backend); coreml (macOS 15+): the "
                        "exported packages timed call by call per compute unit")
    return parser


def check_args(args) -> None:
    """Every check that needs no model. Raises ValueError (one line naming the flag)."""
    from rvqspec_lib.cli.common import check_seed

    check_seed(args.seed)
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    if args.prefix_len < 1 or args.talker_context < 1:
        raise ValueError(f"--prefix-len and --talker-context must be >= 1, got {args.prefix_len} and "
                         f"{args.talker_context}")
    if max(args.queries) > MAX_QUERIES:
        raise ValueError(f"--queries up to {MAX_QUERIES} (a verify call over more nodes is not a draft tree), got "
                         f"{max(args.queries)}")
    dev = str(args.device)
    if not (dev == "cpu" or dev.startswith(("cuda", "mps"))):
        raise ValueError(f"--device {dev!r}: use cpu, cuda[:N] or mps")
    if args.backend is not None and args.backend not in BACKENDS:
        raise ValueError(f"unknown --backend {args.backend!r}: use one of {', '.join(BACKENDS)}")
    if getattr(args, "decoders", None) is not None:
        from rvqspec_lib.cli.common import check_decoder_files
        from rvqspec_lib.spec.decoder_names import parse_decoder_name, split_decoder_list

        if args.backend is None:
            raise ValueError("--decoders is for --backend (frame times per decoder); the call latencies take none")
        for name in split_decoder_list(args.decoders):
            d = parse_decoder_name(name)
            if d.kind == "auto" or d.best_window:
                raise ValueError(f"bench times named decoders: {d.text} is chosen elsewhere; give e.g. chain:4,paper")
            check_decoder_files(d, args.model)  # the drafter and trees beside the model, before it loads


def run(args: argparse.Namespace, threads: int) -> int:
    """Run the benchmark described by parsed :func:`add_args` options; print the table; return exit code 0.

    Raises:
        rvqspec_lib.models.loader.ModelNotFoundError: unknown ``--model``.
        ValueError: a bad flag (:func:`check_args`), a CUDA device this torch does not have.
    """
    started = getattr(args, "_started", None) or time.perf_counter()
    check_args(args)
    threads = apply_threads(threads)  # after the cheap checks: torch loads here
    if args.backend is not None:
        from rvqspec_lib.cli.export import run_bench_backend

        return run_bench_backend(args)
    import torch

    from rvqspec_lib.common.provenance import provenance, save_json
    from rvqspec_lib.eval.bench import bench_model, format_table
    from rvqspec_lib.models.loader import load_model, model_facts

    dev = str(args.device)
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {dev}: this torch has no CUDA device; use --device cpu")
    model_facts(args.model)  # unknown names and configs that are not Qwen3-TTS: one line, before loading
    t = time.perf_counter()
    loaded = load_model(args.model, dtype=args.dtype, seed=args.seed, device=args.device)
    load_s = time.perf_counter() - t
    result = bench_model(loaded, prefix_len=args.prefix_len, query_sizes=args.queries,
                         talker_context=args.talker_context, warmup=args.warmup, repeats=args.repeats,
                         seed=args.seed, progress=not args.no_progress)
    result["load_s"] = load_s
    result["total_s"] = time.perf_counter() - started
    print(format_table(result))  # its header shows the thread count (result["threads"], torch's own count)
    if args.json_path:
        params = {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)}
        path = save_json(result, args.json_path, provenance(params, seed=args.seed))
        print(f"wrote {path}")
    return 0
