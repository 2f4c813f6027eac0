"""``rvqspec bench`` (and ``make bench``): per-call latency of the talker step and of code-predictor calls with
Q query positions, printed as a table with device, dtype and thread count, and optionally written as JSON with its
provenance. The timing itself is :func:`rvqspec_lib.eval.bench.bench_model` (method: docs/style.md#benchmarks).
``--backend NAME``: frame times per decoder through one backend; ``--table``: the table a user acts on
(:mod:`rvqspec_lib.eval.bench_table`: stepped AR, fused AR, best speculative, fused speculative and auto per
precision and backend, for the embedded model and the replayed 0.6B architecture), written as CSV + Markdown + JSON.
"""

from __future__ import annotations

import argparse
import math
import time

from rvqspec_lib.cli.common import add_threads_arg, apply_threads, note
from rvqspec_lib.eval.bench import DEFAULT_QUERY_SIZES, PRECISION_QUERY_SIZES

#: ``--backend`` values: rvqspec_lib.eval.export_timing.BACKENDS, repeated here so that the parser does not import
#: torch (tests/test_export_cli.py checks that the two agree).
BACKENDS = ("eager", "compile", "onnx", "coreml", "cuda", "native")

#: ``--backend`` values that time every precision of rvqspec_lib.models.precision (the fused rounds and the lean
#: stack run bfloat16 and int8 layers); the others are float32 only (their exported or captured graphs).
BACKEND_PRECISIONS_ANY = ("eager", "compile", "native")

#: Largest --queries value: a verify call over more nodes is not a draft tree.
MAX_QUERIES = 1024
#: --table defaults (rvqspec_lib.eval.bench_table's, repeated so that the parser imports no torch).
TABLE_REPEATS = 5
TABLE_MODELS = ("embedded", "qwen3-tts-0.6b-random")
TABLE_BACKENDS_DEFAULT = ("eager", "native")


def _int_list(s: str) -> list[int]:
    try:
        vals = [int(v) for v in s.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError("give query positions as comma-separated whole numbers, e.g. 1,2,4,8") \
            from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"query positions are >= 1: give e.g. 1,2,4,8 (at most {MAX_QUERIES})")
    return vals


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench`` options to ``parser`` (the ``bench`` sub-parser of ``rvqspec``). Returns the parser.

    Options: ``--model`` (default ``qwen3-tts-0.6b-random``), ``--json PATH``, ``--repeats``, ``--warmup``,
    ``--threads``, ``--queries 1,2,4,...``, ``--prefix-len``, ``--talker-context``, ``--dtype``, ``--device``,
    ``--seed``, ``--no-progress``, ``--backend NAME``, ``--noise-target F``.
    """
    parser.add_argument("--model", default="qwen3-tts-0.6b-random",
                        help="embedded (the shipped trained model), tiny-random, qwen3-tts-0.6b-random, "
                             "qwen3-tts-1.7b-random, a checkpoint dir or hub id")
    parser.add_argument("--json", dest="json_path", default=None, help="write the full result (+ provenance) here")
    parser.add_argument("--repeats", type=int, default=None, help="default 20: call latencies, timed calls per query size (median reported); --backend, "
                             "timed frames per decoder (each frame decoded once, median reported); --table: default "
                             f"{TABLE_REPEATS} frames per decoder")
    parser.add_argument("--noise-target", type=float, default=None, metavar="F",
                        help="call latencies and --table: --repeats becomes the minimum, timing goes on until every "
                             "median's relative standard error is <= F (e.g. 0.02), or 4 x --repeats "
                             "(default: exactly --repeats)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls before each measurement (default 3; "
                        "--table: 1 untimed frame per decoder)")
    add_threads_arg(parser)
    parser.add_argument("--queries", type=_int_list, default=None,
                        help="query positions per code-predictor call, comma-separated (default "
                             f"{','.join(map(str, DEFAULT_QUERY_SIZES))}; with several --dtype "
                             f"{','.join(map(str, PRECISION_QUERY_SIZES))}; at most {MAX_QUERIES})")
    parser.add_argument("--prefix-len", type=int, default=8, help="KV prefix of the code-predictor call")
    parser.add_argument("--talker-context", type=int, default=64, help="KV prefix of the talker step")
    parser.add_argument("--dtype", default=None,
                        help="float32, bfloat16, int8 (int8 weights, bfloat16 activations), int8-dynamic (int8 weights and "
                             "per-row int8 activations), float64, float16 (GPUs); "
                             "several comma-separated (e.g. float32,bfloat16,int8): code-predictor calls of every "
                             "precision timed interleaved against the weight-streaming floor (docs/precision.md); "
                             "default float32, with --table the precisions this CPU runs natively")
    parser.add_argument("--forwards", default=None,
                        help="the precision table (the default with several --dtype): the forwards of the "
                             "code-predictor call timed side by side, comma-separated: official (the official module), "
                             "native (one C call over packed weights, docs/precision.md#the-native-forward), or all "
                             "(both, official alone where the native forward cannot be built; the default)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    parser.add_argument("--decoders", default=None,
                        help="with --backend: comma-separated decoder names (rvqspec synth --help lists them: ar, "
                             "chain:N, tree[:PATHS], tree:calibrated[-point-mass|-sampled]:N[@DRAFTER], paper[:N], "
                             "auto (the choice synth --decoder auto makes, cached), ...; default AR, chain:4, the "
                             "default tree, and when the model ships them calibrated:4, calibrated:16, paper (the "
                             "paper's decoder) and auto)")
    parser.add_argument("--backend", default=None, help="instead of call latencies: frame times of AR, the fused AR "
                        "frame, Chain(4), the fused speculative chain and the trees through one verify backend "
                        "(eager, compile, onnx, native, cuda; native: the C forward, its fused frames one C call "
                        "a frame), one interleaved run (rvqspec_lib.eval.export_timing."
                        "bench_backend), in the --dtype given (eager, compile and native: float32, bfloat16, int8, "
                        "int8-dynamic; the others float32); coreml (macOS 15+): the exported packages timed call by "
                        "call per compute unit")
    parser.add_argument("--table", action="store_true",
                        help="the table to act on (what make bench prints; docs/precision.md#the-table): per "
                             "precision (--dtype, default the CPU's native ones) and backend (--backends) the rows "
                             "stepped AR, fused AR, the best speculative decoder (chains 3,4,6 and calibrated trees "
                             "N 4,8,16), the fused speculative round (fused chains and point-mass trees of those; "
                             "absent in a replay) and auto's choice, in ms per frame, as the inner loop's real-time "
                             "factor (ms / 80) and as a multiple of the fused AR frame, for --models, beside the "
                             "weight-streaming floor and the public ports' "
                             "figures; random-weight models are timed as a timing replay (--acceptance). Written to "
                             "--table-out STEM .csv/.md/.json. Defaults (eager, 5 frames per decoder after 1 untimed, the native "
                             "precisions): under 10 minutes on 2 idle cores with 1 thread")
    parser.add_argument("--models", default=",".join(TABLE_MODELS),
                        help=f"--table: comma-separated models (default {','.join(TABLE_MODELS)})")
    parser.add_argument("--backends", default=",".join(TABLE_BACKENDS_DEFAULT),
                        help=f"--table: comma-separated backends of eager, native, compile, onnx (default "
                             f"{','.join(TABLE_BACKENDS_DEFAULT)}; native times every decoder through the C forward "
                             "and its fused frames as one C call a frame; a later compile or onnx backend times AR, "
                             "its fused AR frame and the first one's best speculative decoder and auto's choice: "
                             "compiling each call shape takes minutes on a small shared CPU, so eager,compile adds "
                             "about that per shape)")
    parser.add_argument("--acceptance", default=None, metavar="FILE",
                        help="timing replay of a random-weight model (--table, or --backend): the acceptance "
                             "table its frames replay (a calibration file, or the JSON / CSV shapes of "
                             "docs/precision.md#timing-replay); default the embedded model's calibration "
                             "(data/embedded/model/trees/heads.json). Timing only: replayed frames give no codes")
    parser.add_argument("--table-out", default="build/bench_table", metavar="STEM",
                        help="--table: output stem, written as STEM.csv, STEM.md, STEM.json (+ provenance; default "
                             "build/bench_table, its folder created)")
    return parser


def check_args(args) -> None:
    """Every check that needs no model. Raises ValueError (one line naming the flag)."""
    from rvqspec_lib.cli.common import check_seed

    check_seed(args.seed)
    table = bool(getattr(args, "table", False))
    if getattr(args, "repeats", None) is None:
        args.repeats = TABLE_REPEATS if table else 20
    if getattr(args, "dtype", None) is None and not table:
        args.dtype = "float32"
    if getattr(args, "warmup", None) is None:
        args.warmup = 1 if table else 3
    target = getattr(args, "noise_target", None)
    if target is not None:
        from rvqspec_lib.eval.noise import repeat_cap

        if getattr(args, "backend", None) is not None and not table:
            raise ValueError("--noise-target applies to the call latencies and --table: drop it with --backend")
        if not table and len(dtypes(args)) > 1:
            raise ValueError("--noise-target applies to one --dtype's call latencies (or --table): drop it or give "
                             "one --dtype")
        if not (target > 0 and math.isfinite(target)):  # the flags named, not repeat_cap's arguments
            raise ValueError(f"--noise-target {target:g} is not a relative standard error: give a fraction > 0 "
                             "(e.g. --noise-target 0.02 for 2%), or drop it for exactly --repeats timings")
        if args.repeats < 2:
            raise ValueError(f"--noise-target needs --repeats >= 2 (the minimum: one timing shows no noise), got "
                             f"--repeats {args.repeats}")
        repeat_cap(target, args.repeats, None)
    if table:
        return check_table_args(args)
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    if args.prefix_len < 1 or args.talker_context < 1:
        raise ValueError(f"--prefix-len and --talker-context must be >= 1, got {args.prefix_len} and "
                         f"{args.talker_context}")
    check_dtypes(args)
    if getattr(args, "acceptance", None):
        if args.backend is None:
            raise ValueError("--acceptance replays the acceptance of speculative frames: use it with --backend or "
                             "--table")
        from rvqspec_lib.eval.replay import read_acceptance

        args.acceptance_table = read_acceptance(args.acceptance)
    forwards = getattr(args, "forwards", None)
    if forwards is not None:
        from rvqspec_lib.eval.bench import FORWARDS

        args.forward_list = None if forwards == "all" else [f for f in str(forwards).replace(" ", "").split(",") if f]
        bad = [f for f in args.forward_list or () if f not in FORWARDS]
        if bad or args.forward_list == []:
            raise ValueError(f"--forwards {forwards!r}: use all, or some of {', '.join(FORWARDS)}, comma-separated")
        if args.backend is not None:
            raise ValueError("--forwards times code-predictor calls: drop it with --backend (frame times)")
        if str(args.device) != "cpu" and "native" in (args.forward_list or ()):
            raise ValueError(f"--forwards native runs on the CPU: drop native, or --device {args.device}")
    args._queries_given = args.queries is not None
    if args.queries is None:
        table = len(dtypes(args)) > 1 or getattr(args, "forwards", None) is not None
        args.queries = list(PRECISION_QUERY_SIZES if table else DEFAULT_QUERY_SIZES)
    if max(args.queries) > MAX_QUERIES:
        raise ValueError(f"--queries up to {MAX_QUERIES} (a verify call over more nodes is not a draft tree), got "
                         f"{max(args.queries)}")
    dev = str(args.device)
    if not (dev == "cpu" or dev.startswith(("cuda", "mps"))):
        raise ValueError(f"--device {dev!r}: use cpu, cuda[:N] or mps")
    if args.backend is not None and args.backend not in BACKENDS:
        raise ValueError(f"unknown --backend {args.backend!r}: use one of {', '.join(BACKENDS)}")
    if args.backend is not None and getattr(args, "_queries_given", False):
        raise ValueError("--queries sets the call latencies' query positions: drop it with --backend (frame times)")
    _check_json_path(getattr(args, "json_path", None))
    if getattr(args, "decoders", None) is not None:
        from rvqspec_lib.cli.common import check_decoder_files
        from rvqspec_lib.decoding.decoder_names import parse_decoder_name, split_decoder_list

        if args.backend is None:
            raise ValueError("--decoders is for --backend (frame times per decoder); the call latencies take none")
        for name in split_decoder_list(args.decoders):
            d = parse_decoder_name(name, without=("chain:best",))
            if d.kind == "ssd-lossy":
                raise ValueError(f"--decoders {d.text}: ssd-lossy is a LOSSY control for synth and eval-wer; bench "
                                 "times lossless decoders: drop it")
            if d.best_window:
                raise ValueError(f"bench times named decoders: {d.text} is chosen elsewhere; give e.g. chain:4,paper,auto")
            capped = check_decoder_files(d, args.model)  # the drafter and trees beside the model, before it loads
            if capped:
                note(capped)


def check_table_args(args) -> None:
    """``--table``: the models, precisions, backends and acceptance file, checked before any model loads (one
    ValueError line naming the fix: an absent backend such as onnxruntime not importable, a precision the CPU does
    not run natively, a malformed acceptance table)."""
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    for flag in ("backend", "decoders", "queries", "forwards"):
        if getattr(args, flag, None) is not None:
            raise ValueError(f"--table chooses its own decoders, backends and forwards: drop --{flag} (use "
                             "--backends)")
    from rvqspec_lib.eval.bench_table import check_table_args as check
    from rvqspec_lib.models.precision import native_precisions

    args.precision_list = dtypes(args) if args.dtype else list(native_precisions())
    check_no_cpu_float16(args.precision_list, args.device)
    args.model_list = [m for m in str(args.models).replace(" ", "").split(",") if m]
    args.backend_list = [b for b in str(args.backends).replace(" ", "").split(",") if b]
    if str(args.device) != "cpu":
        raise ValueError(f"--table times the CPU: drop --device {args.device} (a GPU: scripts/gpu_bench.py)")
    if not args.model_list or not args.backend_list:
        raise ValueError("--models and --backends need at least one name each")
    check(args.model_list, args.precision_list, args.backend_list)
    from rvqspec_lib.eval.replay import default_acceptance, read_acceptance

    args.acceptance_table = read_acceptance(args.acceptance) if args.acceptance else default_acceptance()
    from pathlib import Path

    if Path(args.table_out).is_dir():
        raise ValueError(f"--table-out {args.table_out} is a folder; it takes a STEM (files STEM.csv, STEM.md, "
                         f"STEM.json): give e.g. {Path(args.table_out) / 'bench_table'}")
    try:
        Path(args.table_out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--table-out {args.table_out}: its folder cannot be made ({e.strerror}): choose another") \
            from None


def _check_json_path(path) -> None:
    """``--json PATH``: its folder must exist and PATH must not be a folder (as ``synth --json``), before any work."""
    if path is None:
        return
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--json {path} is a folder: give a file name, e.g. {p / 'bench.json'}")
    if not p.parent.is_dir():
        raise ValueError(f"--json {path}: its folder {p.parent} does not exist: create it or choose another path")


def dtypes(args) -> list[str]:
    """The ``--dtype`` names, in order (comma-separated)."""
    return [d for d in str(args.dtype).replace(" ", "").split(",") if d]


def check_no_cpu_float16(names, device) -> None:
    """Raises ValueError (one line naming the fix) when ``--dtype`` names float16 on a CPU device: torch runs it
    there, emulated, so its timings would say nothing of a device."""
    if "float16" not in names or not str(device).startswith("cpu"):
        return
    from rvqspec_lib.models.precision import native_precisions

    bf16 = "bfloat16" in native_precisions()
    raise ValueError("--dtype float16 is a GPU precision here (a CPU emulates it): on the CPU use float32, or "
                     f"bfloat16 where the CPU has AVX512-BF16 or AMX-BF16 (this one does{'' if bf16 else ' not'}); "
                     "float16 on a GPU: --device cuda")


def check_dtypes(args) -> None:
    """``--dtype``: known names, several only of the precisions, each one the CPU runs natively (on ``--device
    cpu``; float16 never on the CPU); with ``--backend`` one precision, and float32 only unless the backend is one of
    :data:`BACKEND_PRECISIONS_ANY`. Raises ValueError (one line naming the fix); imports no torch model."""
    from rvqspec_lib.models.precision import PRECISIONS, check_precision

    names = dtypes(args)
    known = (*PRECISIONS, "float64", "float16")
    bad = [d for d in names if d not in known]
    if not names or bad:
        raise ValueError(f"unknown --dtype {','.join(bad) or args.dtype!r}: use {', '.join(known)}, or several of "
                         f"{', '.join(PRECISIONS)} comma-separated")
    check_no_cpu_float16(names, args.device)
    if len(names) > 1 and any(d not in PRECISIONS for d in names):
        raise ValueError(f"several --dtype values are compared as precisions: use some of {', '.join(PRECISIONS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--dtype {args.dtype}: each precision once")
    if args.backend is not None and names != ["float32"]:
        if len(names) > 1 or names[0] not in PRECISIONS:
            raise ValueError(f"--backend times one precision: give --dtype one of {', '.join(PRECISIONS)} (several "
                             "side by side: rvqspec bench --table --dtype float32,bfloat16,int8)")
        if args.backend in BACKENDS and args.backend not in BACKEND_PRECISIONS_ANY:
            raise ValueError(f"--backend {args.backend} times float32 frames (its graphs are float32): drop --dtype "
                             f"{args.dtype}, or use --backend eager or compile for {args.dtype}")
    for d in names:
        if d in PRECISIONS:
            check_precision(d, device=str(args.device))


def run(args: argparse.Namespace, threads: int) -> int:
    """Run the benchmark described by parsed :func:`add_args` options; print the table; return exit code 0.

    Raises:
        rvqspec_lib.models.loader.ModelNotFoundError: unknown ``--model``.
        ValueError: a bad flag (:func:`check_args`), a CUDA device this torch does not have.
    """
    started = getattr(args, "_started", None) or time.perf_counter()
    check_args(args)
    threads = apply_threads(threads)  # after the cheap checks: torch loads here
    if getattr(args, "table", False):
        return _run_table(args, started)
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
    from rvqspec_lib.models.precision import ACTIVATION_DTYPE, PRECISIONS, apply_precision

    model_facts(args.model)  # unknown names and configs that are not Qwen3-TTS: one line, before loading
    names = dtypes(args)
    if len(names) > 1 or getattr(args, "forwards", None) is not None:
        if any(n not in PRECISIONS for n in names):
            raise ValueError(f"--forwards compares precisions: give --dtype some of {', '.join(PRECISIONS)}")
        return _run_precisions(args, names, started)
    prec = names[0]
    t = time.perf_counter()
    load_dtype = ACTIVATION_DTYPE[prec] if prec in PRECISIONS else prec
    loaded = load_model(args.model, dtype=load_dtype, seed=args.seed, device=args.device)
    if prec in ("int8", "int8-dynamic"):
        apply_precision(loaded.code_predictor, prec, require_native=False)  # checked in check_args
    load_s = time.perf_counter() - t
    result = bench_model(loaded, prefix_len=args.prefix_len, query_sizes=args.queries,
                         talker_context=args.talker_context, warmup=args.warmup, repeats=args.repeats,
                         seed=args.seed, progress=not args.no_progress,
                         noise_target=getattr(args, "noise_target", None))
    result["load_s"] = load_s
    print(format_table(result))  # its header shows the thread count (result["threads"], torch's own count)
    if dev == "cpu":
        from rvqspec_lib.eval.bench import floor_line
        from rvqspec_lib.eval.floor import call_weight_bytes, read_bandwidth

        result["bandwidth"] = read_bandwidth()
        result["weight_bytes"] = call_weight_bytes(loaded.code_predictor, n_queries=1)
        print(floor_line(result, result["bandwidth"], result["weight_bytes"]))
    result["total_s"] = time.perf_counter() - started
    if args.json_path:
        params = {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)}
        path = save_json(result, args.json_path, provenance(params, seed=args.seed))
        print(f"wrote {path}")
    return 0


def _run_precisions(args, names: list[str], started: float) -> int:
    """``--dtype a,b,...``: :func:`rvqspec_lib.eval.bench.bench_precisions` on the float32 model; print, write JSON."""
    from rvqspec_lib.common.provenance import provenance, save_json
    from rvqspec_lib.eval.bench import bench_precisions, format_precision_table
    from rvqspec_lib.models.loader import load_model

    forwards = getattr(args, "forward_list", None)
    if forwards is None:  # default: both where the native forward builds
        from rvqspec_lib.models.kernels import cpforward

        forwards = ["official"]
        if str(args.device) == "cpu" and cpforward.available():
            forwards.append("native")
        elif str(args.device) == "cpu":
            note(f"the native forward is not timed: {cpforward.unavailable_reason()}")
    elif "native" in forwards:
        from rvqspec_lib.models.kernels import cpforward

        if not cpforward.available():
            raise ValueError(f"--forwards native: the native forward cannot be built here "
                             f"({cpforward.unavailable_reason()}): drop native")
    loaded = load_model(args.model, dtype="float32", seed=args.seed, device=args.device)
    result = bench_precisions(loaded, names, query_sizes=args.queries, prefix_len=args.prefix_len,
                              warmup=args.warmup, repeats=args.repeats, seed=args.seed,
                              progress=not args.no_progress, forwards=forwards)
    result["total_s"] = time.perf_counter() - started
    print(format_precision_table(result))
    if args.json_path:
        params = {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)}
        path = save_json(result, args.json_path, provenance(params, seed=args.seed))
        print(f"wrote {path}")
    return 0


def _run_table(args, started: float) -> int:
    """``--table``: :func:`rvqspec_lib.eval.bench_table.bench_table`, printed and written (CSV + Markdown + JSON with
    provenance)."""
    import sys

    from rvqspec_lib.common.provenance import provenance
    from rvqspec_lib.eval.bench_table import bench_table, format_bench_table, save_bench_table

    result = bench_table(models=args.model_list, precisions=args.precision_list, backends=args.backend_list,
                         repeats=args.repeats, warmup=args.warmup if args.warmup is not None else 1,
                         acceptance=args.acceptance_table, seed=args.seed,
                         progress=not args.no_progress and sys.stderr.isatty(),
                         noise_target=getattr(args, "noise_target", None))
    result["meta"]["total_s"] = time.perf_counter() - started
    print(format_bench_table(result))
    params = {k: v for k, v in vars(args).items()
              if not k.startswith("_") and not callable(v) and k != "acceptance_table"}
    out = save_bench_table(result, args.table_out, provenance(params, seed=args.seed))
    print(f"wrote {out['csv']}, {out['md']}, {out['json']}")
    if args.json_path:
        from rvqspec_lib.common.provenance import save_json

        print(f"wrote {save_json(result, args.json_path, provenance(params, seed=args.seed))}")
    return 0
