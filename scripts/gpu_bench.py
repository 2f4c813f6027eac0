"""GPU leg of notebook 05: the real-size code predictor on one CUDA GPU, CUDA graphs on, AR vs chains vs trees vs the
fused AR frame vs the fused speculative rounds, plus the verify cost curve and the speedup it projects. Writes a JSON
that notebook 05 reads.

    python scripts/gpu_bench.py                                  # 0.6B architecture, bfloat16, CUDA graphs
    python scripts/gpu_bench.py --out figures/05_gpu.json --repeats 30 --calibration figures/05_calibration.json
    python scripts/gpu_bench.py --fused-chains 4 --budgets 4 --chains 4   # a short run: AR, chain 4, fused chain 4
    python scripts/gpu_bench.py --dry-run --out build/gpu_dry.json   # the same logic on the CPU, tiny model, eager

What runs (rvqspec_lib.eval.export_timing, rvqspec_lib.models.cuda_graphs; docs/style.md#benchmarks):

1. ``load_model(--model, dtype=bfloat16, device="cuda")`` (random weights for the ``*-random`` architectures:
   timing only; tokens per call measured on them mean nothing);
2. frame times, interleaved, the GPU synchronised around each frame: AR, ``Chain(w)`` for ``--chains``, the
   calibrated tree of each node budget in ``--budgets`` (from ``--calibration``, the trees notebook 05 calibrated on
   the embedded model; without it, chains only), each through :class:`GraphedBackend` (every verify call shape
   captured once as a CUDA graph), the fused AR frame captured as one graph (:class:`GraphedFrame`), and the fused
   speculative chain of each window in ``--fused-chains`` (default: the ``--chains``) with its prefill and the round
   of every start depth captured as one graph each (:class:`GraphedChainFrame`: static buffers, the frame's uniforms
   drawn up front into a static input, one host read per round, the new depth); the JSON's ``fused_spec`` rows give
   each fused round's ms per frame, tokens per call and ``x_fused_ar``, its frame time over the fused AR frame's
   (:func:`rvqspec_lib.eval.export_timing.fused_spec_vs_fused_ar`; below 1 the speculative frame is faster);
3. the verify cost curve t(N)/t(1) of one captured verify call for N in ``--queries``, and the speedup it projects
   for the calibration's expected tokens per call, ``E(N) t(1) / t(N)`` (docs/methods.md#choosing-the-node-budget).

Budget: about 2-4 minutes on one recent GPU (capture is under a second per shape; --max-minutes stops adding
conditions past the budget). Without CUDA it stops with a one-line error unless ``--dry-run`` is given, which runs
every step on the CPU with ``--model tiny-random``, float32, no capture (``use_graphs=False``), two repeats: what
tests/test_export_cli.py checks (and tests/test_export_timing.py the graphed frames' logic).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from rvqspec_lib.common.provenance import provenance, resolve_out_dir, save_json  # noqa: E402

DEFAULT_OUT = "figures/05_gpu.json"
DEFAULT_CALIBRATION = "figures/05_calibration.json"
FORMAT = "rvqspec-gpu-bench"


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default qwen3-tts-0.6b-random (tiny-random with --dry-run)")
    p.add_argument("--dtype", default=None, help="default bfloat16 (float32 with --dry-run)")
    p.add_argument("--out", default=None, help=f"JSON to write (default {DEFAULT_OUT}; build/gpu_bench_dry.json "
                   "with --dry-run)")
    p.add_argument("--calibration", default=None, help=f"calibrated trees (default {DEFAULT_CALIBRATION} if present)")
    p.add_argument("--budgets", type=_ints, default=[2, 4, 8, 16, 32, 64], help="tree node budgets N")
    p.add_argument("--chains", type=_ints, default=[2, 4, 8], help="chain windows")
    p.add_argument("--fused-chains", type=_ints, default=None, help="windows of the fused speculative chain, one "
                   "CUDA graph per start depth (default: the --chains; empty string: none)")
    p.add_argument("--queries", type=_ints, default=[1, 2, 4, 8, 16, 32, 64], help="verify cost curve N")
    p.add_argument("--repeats", type=int, default=None, help="timed frames per condition (default 30; 2 dry)")
    p.add_argument("--warmup", type=int, default=3, help="untimed frames per condition first (capture happens here)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the host side of the loop; 1 as the "
                   "project's other timings)")
    p.add_argument("--max-minutes", type=float, default=9.0, help="stop adding conditions past this wall time")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model, no CUDA graphs: check the logic")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_bench: error: no CUDA device here (torch.cuda.is_available() is False): run it on a GPU machine "
              "with a CUDA build of torch, or pass --dry-run to check the script on the CPU", file=sys.stderr)
        return 2
    model = args.model or ("tiny-random" if args.dry_run else "qwen3-tts-0.6b-random")
    dtype = args.dtype or ("float32" if args.dry_run else "bfloat16")
    device = "cpu" if args.dry_run else "cuda"
    repeats = args.repeats or (2 if args.dry_run else 30)
    warmup = min(args.warmup, 1) if args.dry_run else args.warmup
    out = Path(args.out or ("build/gpu_bench_dry.json" if args.dry_run else DEFAULT_OUT))
    if not out.is_absolute():
        out = resolve_out_dir(out.parent) / out.name
    cal_path = args.calibration or (DEFAULT_CALIBRATION if (resolve_out_dir("figures") / "05_calibration.json")
                                    .exists() else None)
    if args.calibration and not Path(args.calibration).is_file():
        print(f"gpu_bench: error: --calibration {args.calibration} does not exist (notebook 05 writes "
              f"{DEFAULT_CALIBRATION}); drop it to time chains only", file=sys.stderr)
        return 2
    if min(args.budgets + args.queries) < 1 or max(args.budgets + args.queries) > 64 or repeats < 1:
        print("gpu_bench: error: --budgets and --queries must lie in 1..64 and --repeats be >= 1", file=sys.stderr)
        return 2
    fused_windows = args.chains if args.fused_chains is None else args.fused_chains
    if any(not 2 <= w <= 8 for w in args.chains + fused_windows):
        print("gpu_bench: error: --chains and --fused-chains are chain windows: give values in 2..8", file=sys.stderr)
        return 2

    from rvqspec_lib.eval import export_timing as T
    from rvqspec_lib.eval.speed import random_contexts
    from rvqspec_lib.models.cuda_graphs import GraphedBackend, GraphedChainFrame, GraphedFrame
    from rvqspec_lib.models.loader import load_model

    t_start = time.perf_counter()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if not args.dry_run:
        torch.backends.cuda.matmul.allow_tf32 = True
    lm = load_model(model, dtype=dtype, device=device, seed=args.seed)
    cp = lm.code_predictor.eval()
    calibration = None
    if cal_path:
        p = Path(cal_path)
        calibration = json.loads((p if p.is_absolute() else resolve_out_dir(p.parent) / p.name).read_text())
        if int(calibration["n_codes"]) != int(cp.config.num_code_groups) - 1:
            print(f"gpu_bench: error: {cal_path} was calibrated for {calibration['n_codes']} codes a frame, {model} "
                  f"has {int(cp.config.num_code_groups) - 1}", file=sys.stderr)
            return 2
    budgets = [n for n in args.budgets if calibration is None or str(n) in calibration["best_kind"]]
    decoders = T.decoders_by_budget(calibration, budgets if calibration else [], chains=args.chains)
    contexts = random_contexts(cp, 16, seed=args.seed).to(device)
    backend = GraphedBackend(cp, use_graphs=not args.dry_run)
    frame = GraphedFrame(cp, use_graphs=not args.dry_run)
    fused_spec = [GraphedChainFrame(cp, w, use_graphs=not args.dry_run) for w in fused_windows]
    for f in fused_spec:  # every round graph captured before any timed frame
        f.compile_all(1)
    rows, skipped = [], []
    budget_s = args.max_minutes * 60
    # conditions in groups, so that a slow machine still writes AR, the fused frame and the chains
    groups = [{k: v for k, v in decoders.items() if not k.startswith("tree")},
              {k: v for k, v in decoders.items() if k.startswith("tree")}]
    meta = {}
    for i, group in enumerate(groups):
        if not group:
            continue
        if time.perf_counter() - t_start > budget_s:
            skipped += list(group)
            continue
        res = T.device_frame_times(cp, contexts, {"AR": decoders["AR"], **group}, backend,
                                   frame if i == 0 else None, fused_spec=fused_spec if i == 0 else (),
                                   label="cuda-graphs" if not args.dry_run else "dry-run",
                                   repeats=repeats, warmup=warmup, seed=args.seed, progress=sys.stderr.isatty())
        rows += [r for r in res["rows"] if i == 0 or r["decoder"] != "AR"]
        meta = res["meta"]
    n_of = {k: T.node_budget(d) for k, d in decoders.items()}
    for r in rows:
        r["nodes"] = n_of.get(r["decoder"])
    cost = T.device_verify_costs(cp, backend, label="cuda-graphs" if not args.dry_run else "dry-run",
                                 query_sizes=args.queries, repeats=repeats, warmup=warmup, seed=args.seed,
                                 progress=sys.stderr.isatty())
    projected = T.projected_speedup(T.expected_tokens_per_call(calibration), cost["rows"]) if calibration else []
    result = {
        "format": FORMAT, "dry_run": bool(args.dry_run), "model": model, "dtype": dtype,
        "random_weights": lm.is_random, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "cuda": torch.version.cuda, "cuda_graphs": backend.use_graphs, "calibration": cal_path,
        "frame_rows": rows, "speedup_vs_n": T.speedup_vs_n(rows), "summary": T.summary_by_backend(rows),
        "fused_spec": T.fused_spec_vs_fused_ar(rows),
        "verify_cost": cost["rows"], "projected": projected, "skipped": skipped, "meta": meta,
        "capture_s": {str(k): round(v, 3) for k, v in backend.capture_s.items()},
        "frame_capture_s": {str(k): round(v, 3) for k, v in frame.compile_s.items()},
        "fused_spec_capture_s": {f.name: round(sum(f.compile_s.values()), 3) for f in fused_spec},
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    params = {"model": model, "dtype": dtype, "repeats": repeats, "warmup": warmup, "seed": args.seed,
              "threads": torch.get_num_threads(), "budgets": budgets, "chains": args.chains,
              "fused_chains": fused_windows, "queries": args.queries, "dry_run": bool(args.dry_run),
              "script": "scripts/gpu_bench.py"}
    save_json(result, out, provenance(params, seed=args.seed))
    s = result["summary"][0] if result["summary"] else {}
    print(f"wrote {out} in {result['wall_s']:.0f} s: AR {s.get('ar_ms') or float('nan'):.2f} ms/frame, fused "
          f"{s.get('fused_ms') or float('nan'):.2f}, best speculative {s.get('best_decoder')} "
          f"{s.get('best_ms') or float('nan'):.2f}"
          + "".join(f"; {r['decoder']} {r['ms_per_frame']:.2f} ({r['tokens_per_call']:.2f} tokens/call, "
                    f"x{r['x_fused_ar'] or float('nan'):.2f} the fused AR frame)" for r in result["fused_spec"])
          + (f"; skipped {skipped} (over --max-minutes)" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
