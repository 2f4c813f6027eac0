"""GPU leg of notebook 07 (section 6): the real-size code predictor on one CUDA GPU through the ``compile`` backend
(torch.compile mode "reduce-overhead": CUDA graphs), AR, the fused AR frame, chains, the fused chains and the
calibrated trees in ONE interleaved run, plus the verify cost curve and the speedup it projects. Writes a JSON that
notebook 07 reads (its ``gpu_json`` parameter, default ``build/gpu_bench.json``).

    python scripts/gpu_bench.py                                   # 0.6B architecture, bfloat16, compile on cuda
    python scripts/gpu_bench.py --chains 4 --budgets 4,16          # a shorter run
    python scripts/gpu_bench.py --dry-run --out build/gpu_dry.json # the same code on the CPU: tiny model, eager

What runs (docs/style.md#benchmarks): ``load_model(--model, dtype, device="cuda")`` (random weights for the
``*-random`` architectures: timing only; their tokens per call mean nothing); the decoders ``ar``, ``chain:W`` for
``--chains`` and ``tree:calibrated:N`` for ``--budgets`` (from ``--calibration``, the trees notebook 04 calibrated on
the embedded model; without it, chains only) through backend ``--backend``, stepped, and AR and the chains fused
(one graph a round), every graph built before the timing (:func:`rvqspec_lib.eval.speed.build_runners`,
:func:`rvqspec_lib.eval.speed.time_frames`, the GPU synchronised around each frame); then t(N)/t(1) of one verify
call (:func:`rvqspec_lib.eval.speed.verify_cost_curve`) and ``E(N) t(1) / t(N)`` for the calibration's expected
tokens per call (:func:`rvqspec_lib.eval.speed.projected_speedup`, a PROJECTION). Without CUDA it stops with one line
unless ``--dry-run``: ``--model tiny-random``, float32, backend eager, on the CPU, two repeats (tests/test_bench.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_json  # noqa: E402
from rvqspec_lib.eval import speed  # noqa: E402
from rvqspec_lib.models.backends import BACKENDS, available, verify_backend  # noqa: E402
from rvqspec_lib.models.loader import load_model  # noqa: E402
from rvqspec_lib.models.named_decoders import resolve_all  # noqa: E402

DEFAULT_OUT = "build/gpu_bench.json"  # what notebook 07 reads by default
DEFAULT_CALIBRATION = "figures/04_trees_heads.json"  # notebook 04's calibration of the reused heads' trees
FORMAT = "rvqspec-gpu-bench"
COLUMNS = ("decoder", "backend", "fused", "tokens_per_call", "ms_per_frame", "p10_ms", "p90_ms", "speedup_vs_ar",
           "speedup_vs_fused")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default qwen3-tts-0.6b-random (tiny-random with --dry-run)")
    p.add_argument("--dtype", default=None, help="default bfloat16 (float32 with --dry-run)")
    p.add_argument("--backend", default=None, help=f"one of {', '.join(BACKENDS)} (default compile; eager with "
                   "--dry-run)")
    p.add_argument("--out", default=None, help=f"JSON to write (default {DEFAULT_OUT}; build/gpu_bench_dry.json "
                   "with --dry-run)")
    p.add_argument("--calibration", default=None, help=f"calibrated trees (default {DEFAULT_CALIBRATION} if present)")
    p.add_argument("--budgets", type=_ints, default=[4, 8, 16, 32, 64], help="tree node budgets N")
    p.add_argument("--chains", type=_ints, default=[2, 4, 8], help="chain windows (each also fused)")
    p.add_argument("--queries", type=_ints, default=list(speed.QUERY_SIZES), help="verify cost curve N")
    p.add_argument("--repeats", type=int, default=None, help="timed frames per runner (default 30; 2 dry)")
    p.add_argument("--warmup", type=int, default=3, help="untimed frames per runner first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the host side of the loop)")
    p.add_argument("--dry-run", action="store_true", help="the CPU, tiny-random, eager: checks the script")
    return p.parse_args(argv)


def _error(msg: str) -> int:
    print(f"gpu_bench: error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        return _error("no CUDA device here (torch.cuda.is_available() is False): run it on a GPU machine with a CUDA "
                      "build of torch, or pass --dry-run to check the script on the CPU")
    model = args.model or ("tiny-random" if dry else "qwen3-tts-0.6b-random")
    dtype, backend = args.dtype or ("float32" if dry else "bfloat16"), args.backend or ("eager" if dry else "compile")
    device, repeats = "cpu" if dry else "cuda", args.repeats or (2 if dry else 30)
    warmup = min(args.warmup, 1) if dry else args.warmup
    if min(args.budgets + args.queries) < 1 or max(args.budgets + args.queries) > 64 or repeats < 1:
        return _error("--budgets and --queries must lie in 1..64 and --repeats be >= 1")
    if any(not 2 <= w <= 8 for w in args.chains):
        return _error("--chains are chain windows: give values in 2..8")
    ok, why = available(backend, dtype, device) if backend in BACKENDS else (False, f"use one of {BACKENDS}")
    if not ok:
        return _error(f"--backend {backend}: {why}")
    out = Path(args.out or ("build/gpu_bench_dry.json" if dry else DEFAULT_OUT))
    out = out if out.is_absolute() else resolve_out_dir(out.parent) / out.name
    cal_path = args.calibration or (DEFAULT_CALIBRATION if (resolve_out_dir("figures") / Path(DEFAULT_CALIBRATION).name)
                                    .is_file() else None)
    if args.calibration and not Path(args.calibration).is_file():
        return _error(f"--calibration {args.calibration} does not exist (notebook 04 writes {DEFAULT_CALIBRATION}); "
                      "drop it to time chains only")
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    if not dry:
        torch.backends.cuda.matmul.allow_tf32 = True
    lm = load_model(model, dtype=dtype, device=device, seed=args.seed)
    cp = lm.code_predictor.eval()
    calibration = None
    if cal_path:
        p = Path(cal_path)
        calibration = json.loads((p if p.is_absolute() else resolve_out_dir(p.parent) / p.name).read_text())
        if int(calibration["n_codes"]) != lm.n_code_groups - 1:
            return _error(f"{cal_path} was calibrated for {calibration['n_codes']} codes a frame, {model} has "
                          f"{lm.n_code_groups - 1}")
    budgets = [n for n in args.budgets if calibration is not None and str(n) in calibration["best_kind"]]
    names = ["ar", *(f"chain:{w}" for w in args.chains), *(f"tree:calibrated:{n}" for n in budgets)]
    decoders = resolve_all(names, lm, calibrations={"heads": calibration} if calibration else None)
    runners, _ = speed.build_runners([backend], cp, decoders)
    frames = speed.time_frames(runners, speed.random_contexts(cp, 16, seed=args.seed), repeats=repeats,
                               warmup=warmup, seed=args.seed, progress=sys.stderr.isatty(),
                               random_weights=lm.is_random)
    cost = speed.verify_cost_curve(cp, {backend: verify_backend(backend, cp)}, query_sizes=args.queries,
                                   repeats=repeats, warmup=warmup, seed=args.seed, progress=sys.stderr.isatty(),
                                   random_weights=lm.is_random)
    expected = speed.expected_tokens_per_call(calibration) if calibration else {}
    result = {
        "format": FORMAT, "dry_run": dry, "model": model, "dtype": dtype, "backend": backend,
        "random_weights": lm.is_random, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "cuda": torch.version.cuda, "calibration": cal_path, "frame_rows": frames["rows"],
        "summary": speed.summary_by_backend(frames["rows"]), "speedup_vs_n": speed.speedup_vs_n(frames["rows"]),
        "verify_cost": cost["rows"], "projected": speed.projected_speedup(expected, cost["rows"]),
        "meta": frames["meta"], "verify_cost_meta": cost["meta"], "wall_s": round(time.perf_counter() - t_start, 1)}
    params = {"model": model, "dtype": dtype, "backend": backend, "repeats": repeats, "warmup": warmup,
              "seed": args.seed, "threads": torch.get_num_threads(), "budgets": budgets, "chains": args.chains,
              "queries": args.queries, "dry_run": dry, "script": "scripts/gpu_bench.py"}
    save_json(result, out, provenance(params, seed=args.seed))
    print(speed.format_rows(frames["rows"], COLUMNS))
    print(speed.format_rows(cost["rows"]))
    print(f"wrote {out} in {result['wall_s']:.0f} s ({result['device']}, {model} {dtype}, backend {backend})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
