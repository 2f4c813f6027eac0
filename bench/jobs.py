"""The jobs of ``rvqspec bench`` (parser: :mod:`bench.cli`): each checks its flags before any model
loads, times through :mod:`rvqspec_lib.eval` and prints; ``--json`` writes the result with its provenance."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

from rvqspec_lib.cli.common import apply_threads, note
from rvqspec_lib.common.provenance import provenance, save_json
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.decoding.decoder_names import parse_decoder_name, split_decoder_list
from rvqspec_lib.eval import budget, speed
from bench import frames, latency, table as bench_table
from rvqspec_lib.eval.noise import noise_words, repeat_cap
from rvqspec_lib.eval.replay import default_acceptance, read_acceptance
from rvqspec_lib.eval.timing import oversubscribed_note
from rvqspec_lib.models.backends import BACKENDS, available, verify_backend
from rvqspec_lib.models import loader  # loader.load_model looked up at call time (tests replace it)
from rvqspec_lib.models.loader import model_facts
from rvqspec_lib.models.named_decoders import check_files, drafter_calibration, resolve_all
from rvqspec_lib.models.tree_files import load_calibration
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.device.precision import ACTIVATION_DTYPE, PRECISIONS, apply_precision, check_precision, \
    native_precisions

#: ``frames`` without --decoders: these, the calibrated ones when the model ships their files.
FRAME_DECODERS = ("ar", "chain:4", "tree", "tree:calibrated:4", "tree:calibrated:16", "paper", "auto")
#: Decoder forms ``frames`` does not time (:func:`_check_frames` says why), left out of its unknown-name answer.
NOT_TIMED = ("chain:best", "ssd-lossy")
#: Frames whose contexts ``frames`` decodes, round r taking context r mod this.
FRAME_CONTEXTS = 16
#: Row columns ``frames`` prints.
FRAME_COLUMNS = ("decoder", "backend", "fused", "tokens_per_call", "ms_per_frame", "p10_ms", "p90_ms",
                 "speedup_vs_ar", "speedup_vs_fused")
#: Words for the activations of the int8 precisions.
ACTIVATIONS = {"int8": "int8 weights, bfloat16 activations", "int8-dynamic": "int8 weights, per-row int8 activations"}


def run_job(args, threads: int) -> int:
    """Check ``args`` (:func:`check_args`), set the threads, run ``args.job``; returns the exit status 0.

    Raises:
        ValueError: a bad flag or an absent backend (one line naming the fix).
    """
    started = getattr(args, "_started", None) or time.perf_counter()
    check_args(args)
    apply_threads(threads)
    result = JOBS[args.job](args)
    if args.job not in ("table", "pipeline"):  # theirs say it already
        (result.get("meta", result))["total_s"] = round(time.perf_counter() - started, 3)
    if args.json_path:
        print(f"wrote {save_json(result, args.json_path, _provenance(args))}")
    return 0


def _provenance(args) -> dict:
    """The provenance of a job's output: its flags (less the parsed acceptance table) and seed."""
    return provenance({k: v for k, v in vars(args).items() if not k.startswith("_") and k != "acceptance_table"},
                      seed=args.seed)


def _list(text) -> list[str]:
    return [v for v in str(text).replace(" ", "").split(",") if v]


def check_args(args) -> None:
    """Every check of a job's flags that needs no model; fills ``args.dtypes``, ``args.backend_list`` and
    ``args.acceptance_table``. Raises ValueError (one line naming the flag and the fix)."""
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    target = args.noise_target
    if target is not None:
        if not (target > 0 and math.isfinite(target)):
            raise ValueError(f"--noise-target {target:g} is not a relative standard error: give a fraction > 0 "
                             "(e.g. --noise-target 0.02 for 2%), or drop it for exactly --repeats rounds")
        if args.repeats < 2:
            raise ValueError(f"--noise-target needs --repeats >= 2 (the minimum: one timing shows no noise), got "
                             f"--repeats {args.repeats}")
        repeat_cap(target, args.repeats, None)
    device = str(getattr(args, "device", "cpu"))
    if not (device == "cpu" or device.startswith(("cuda", "mps"))):
        raise ValueError(f"--device {device!r}: use cpu, cuda[:N] or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch has no CUDA device; use --device cpu")
    if getattr(args, "prefix_len", 1) < 1 or getattr(args, "talker_context", 1) < 1:
        raise ValueError("--prefix-len and --talker-context must be >= 1")
    args.dtypes = _list(args.dtype) if args.dtype else list(native_precisions())
    if "float16" in args.dtypes and device == "cpu":  # first: every job's answer to float16 on the CPU
        bf16 = "bfloat16" in native_precisions()
        raise ValueError("--dtype float16 is a GPU precision here (a CPU emulates it): on the CPU use float32, or "
                         f"bfloat16 where the CPU has AVX512-BF16 or AMX-BF16 (this one does{'' if bf16 else ' not'});"
                         " float16 on a GPU: --device cuda")
    several = args.job in ("precisions", "table", "pipeline")
    known = PRECISIONS if several else (*PRECISIONS, "float64", "float16")
    bad = [d for d in args.dtypes if d not in known]
    if bad or len(set(args.dtypes)) != len(args.dtypes) or (len(args.dtypes) > 1 and not several):
        raise ValueError(f"--dtype {args.dtype}: give {'some' if several else 'one'} of {', '.join(known)}"
                         f"{', each once, comma-separated' if several else ''}")
    for d in args.dtypes:
        if d in PRECISIONS:
            check_precision(d, device=device)
    if args.job not in ("table", "pipeline"):
        model_facts(args.model)  # unknown names and configs that are not Qwen3-TTS: one line, before loading
    CHECKS.get(args.job, lambda a: None)(args)


def _check_backends(args, backends, flag: str = "--backends") -> None:
    bad = [b for b in backends if b not in BACKENDS]
    if bad or not backends:
        raise ValueError(f"--backends {','.join(backends)}: use some of {', '.join(BACKENDS)}, comma-separated")
    device = str(getattr(args, "device", "cpu"))
    for b in backends:
        for d in args.dtypes:
            ok, why = available(b, d, device)
            if not ok and device != "cpu" and available(b, d, "cpu")[0]:
                raise ValueError(f"{flag} {b} runs on the CPU: drop --device {device}")
            if not ok:
                raise ValueError(f"{flag} {b} is not available here: {why}")


def _check_precisions(args) -> None:
    if args.backends is None:  # default: the official module and, where it builds, the native forward
        args.backend_list = ["official"] + (["native"] if available("native")[0] else [])
        if len(args.backend_list) == 1:
            note(f"the native forward is not timed: {available('native')[1]}")
    else:
        args.backend_list = _list(args.backends)
    _check_backends(args, args.backend_list)


def _check_frames(args) -> None:
    args.backend_list = _list(args.backends)
    if "coreml" in args.backend_list:
        raise ValueError("Core ML packages are timed call by call on macOS 15+: rvqspec export --format coreml")
    _check_backends(args, args.backend_list)
    args.acceptance_table = read_acceptance(args.acceptance) if args.acceptance else None
    if args.queries is not None and 1 not in args.queries:
        raise ValueError(f"--queries {','.join(map(str, args.queries))}: put 1 among them (t(Q)/t(1) is over it)")
    args.calibrations = None
    if args.calibration:
        if not Path(args.calibration).is_file():
            raise ValueError(f"--calibration {args.calibration} does not exist (notebook 04 writes "
                             "figures/04_trees_heads.json): drop it to time the model's own decoders")
        args.calibrations = {"heads": load_calibration(args.calibration, drafter="heads")}

    def check(d):  # the files beside the model, unless --calibration stands in for them
        return None if args.calibrations and d.drafter == "heads" and "calibration" in d.needs else \
            check_files(d, args.model)
    if args.decoders is None:
        args.decoder_names = []
        for text in FRAME_DECODERS:  # the calibrated ones and paper when shipped beside the model
            try:
                check(parse_decoder_name(text))
                args.decoder_names.append(text)
            except (FileNotFoundError, ValueError):
                continue
        return
    names = split_decoder_list(args.decoders)
    parsed = [parse_decoder_name(text, without=NOT_TIMED) for text in names]  # unknown: the forms bench takes
    args.decoder_names = names if any(d.kind == "ar" for d in parsed) else ["ar", *names]  # speedups are over AR
    for d in parsed:
        if d.kind == "ssd-lossy" or d.best_window:
            raise ValueError(f"--decoders {d.text}: bench times named lossless decoders (ssd-lossy is a LOSSY "
                             "control for synth and eval-wer; chain:best is eval-wer's choice): give e.g. "
                             "ar,chain:4,paper,auto")
        capped = check(d)  # the drafter and trees beside the model, before it loads
        if capped:
            note(capped)


def _check_table(args) -> None:
    """``table`` and ``pipeline``: the models (and backends), the job's own checks, the replay and the output stem."""
    args.model_list, args.backend_list = _list(args.models), _list(getattr(args, "backends", "native"))
    if not args.model_list or not args.backend_list:
        raise ValueError("--models and --backends need at least one name each")
    if args.job == "pipeline" and args.stream_repeats < 1:
        raise ValueError(f"--stream-repeats must be >= 1, got {args.stream_repeats}")
    streams = dict(chunk_frames=args.chunk_frames, frames=args.frames, batches=args.batches) \
        if args.job == "pipeline" else {}
    bench_table.check_table_args(args.model_list, args.dtypes, args.backend_list, **streams)
    args.acceptance_table = read_acceptance(args.acceptance) if args.acceptance else default_acceptance()
    _check_table_out(args.table_out)


def _check_table_out(stem: str) -> None:
    out = Path(stem)
    if out.is_dir():
        raise ValueError(f"--table-out {out} is a folder; it takes a STEM (files STEM.csv, STEM.md, STEM.json): give "
                         f"e.g. {out / 'bench_table'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--table-out {out}: its folder cannot be made ({e.strerror}): choose another") from None


CHECKS = {"latency": lambda args: _check_backends(args, [args.backend], "--backend"), "precisions": _check_precisions,
          "frames": _check_frames, "table": _check_table, "pipeline": _check_table}


def _progress(args) -> bool:
    return not args.no_progress and sys.stderr.isatty()


# ----------------------------------------------------------------------------------------------------------------------
# The jobs
# ----------------------------------------------------------------------------------------------------------------------
def latency_job(args) -> dict:
    """``rvqspec bench latency``: :func:`bench.latency.bench_model`, printed; the floor on the CPU."""
    prec = args.dtypes[0]
    lm = loader.load_model(args.model, dtype=ACTIVATION_DTYPE.get(prec, prec), seed=args.seed, device=args.device)
    if prec in ("int8", "int8-dynamic"):
        apply_precision(lm.code_predictor, prec, require_native=False)  # checked in check_args
    result = latency.bench_model(lm, prefix_len=args.prefix_len, query_sizes=args.queries,
                                 talker_context=args.talker_context, backend=args.backend, warmup=args.warmup,
                                 repeats=args.repeats, seed=args.seed, progress=not args.no_progress,
                                 noise_target=args.noise_target, floor=str(args.device) == "cpu")
    print(latency.format_latency(result))
    return result


def precisions_job(args) -> dict:
    """``rvqspec bench precisions``: :func:`bench.latency.bench_precisions` on the float32 model."""
    lm = loader.load_model(args.model, dtype="float32", seed=args.seed)
    result = latency.bench_precisions(lm, args.dtypes, backends=args.backend_list, query_sizes=args.queries,
                                      prefix_len=args.prefix_len, warmup=args.warmup, repeats=args.repeats,
                                      seed=args.seed, progress=_progress(args), noise_target=args.noise_target)
    print(latency.format_precision_table(result))
    if args.talker_contexts:  # the same bandwidth's floors; one slim copy of the talker per precision
        talker = latency.slim_talker(lm.talker)
        tk = latency.bench_talker_precisions(
            talker, args.dtypes, contexts=args.talker_contexts, warmup=args.warmup, repeats=args.repeats,
            forwards=["official"] + (["native"] if available("native")[0] else []),
            seed=args.seed, bandwidth=result["bandwidth"], progress=_progress(args), model_name=lm.name,
            random_weights=lm.is_random)
        print(latency.format_talker_table(tk))
        if available("native")[0]:
            sc = latency.scan_cost(NativeTalker(talker), context=min(args.talker_contexts), repeats=args.repeats)
            tk["scan_cost"] = {**sc, "precision": "float32"}
            print(f"KV scan (float32, context {sc['context']}, capacity {sc['capacity']}): prefix {sc['prefix_ms']:.2f}"
                  f" ms, whole cache {sc['whole_cache_ms']:.2f} ms, saved {sc['saved_ms']:.2f} ms a step")
        result["talker"] = tk
    return result


def frames_job(args) -> dict:
    """``rvqspec bench frames``: the named decoders through the backends, stepped and fused, one interleaved run."""
    prec = args.dtypes[0]  # loaded in its activation dtype: a bfloat16 checkpoint timed as --dtype float32 is float32
    lm = loader.load_model(args.model, dtype=ACTIVATION_DTYPE.get(prec, prec), device=args.device, seed=args.seed)
    table = args.acceptance_table
    if table is not None and not lm.is_random:
        raise ValueError(f"--acceptance replays a trained model's acceptance on a RANDOM-weight architecture; "
                         f"{args.model} has trained weights, whose own acceptance is measured: drop --acceptance")
    cp = lm.code_predictor.eval()
    if prec != "float32":
        apply_precision(cp, prec, require_native=False)  # native here and allowed for these backends: checked
    if str(args.device).startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    decoders = list(resolve_all([n for n in args.decoder_names if n != "auto"], lm,
                                calibrations=args.calibrations).values())
    if "auto" in args.decoder_names:
        choice = budget.auto_for_model(lm, backends=args.backend_list, progress=_progress(args))
        decoders.append(choice.named)
        note(f"--decoder auto chose {choice.reason}")
    try:
        contexts = frames_from_shipped(lm, "evaluation", max_frames=FRAME_CONTEXTS, seed=args.seed).context
        source = f"{len(contexts)} frames of the shipped evaluation split"
    except (FileNotFoundError, ValueError):
        contexts = speed.random_contexts(cp, FRAME_CONTEXTS, seed=args.seed)
        source = f"{FRAME_CONTEXTS} random contexts" + ("" if table else " (tokens per call mean little)")
    runners, _ = speed.build_runners(args.backend_list, cp, decoders,
                                     acceptance=table.oracle(args.seed) if table else None)
    res = speed.time_frames(runners, contexts, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                            noise_target=args.noise_target, progress=_progress(args), random_weights=lm.is_random)
    print(frames.format_rows(res["rows"], FRAME_COLUMNS))
    m = res["meta"]
    dt = f"{prec} ({ACTIVATIONS[prec]})" if prec in ACTIVATIONS else prec
    print(f"{args.model} ({'random' if lm.is_random else 'trained'} weights), {m['device']}, {dt}, {m['threads']} "
          f"thread(s), backends {', '.join(args.backend_list)}; every runner: {args.warmup} warm-up frame(s), then "
          f"{noise_words(m)}; contexts: {source}")
    if table is not None:
        print(table.text + " (no fused speculative rows: a fused frame computes its own acceptance)")
    if oversubscribed_note(m):
        print(oversubscribed_note(m))
    out = {**res, "model": args.model, "backends": args.backend_list, "precision": prec, "contexts": source,
           "device": torch.cuda.get_device_name(m["device"]) if m["device"].startswith("cuda") else m["cpu"],
           "random_weights": lm.is_random, "summary": frames.summary_by_backend(res["rows"]),
           "speedup_vs_n": frames.speedup_vs_n(res["rows"])}
    if args.queries:
        cost = speed.verify_cost_curve(cp, {b: verify_backend(b, cp) for b in args.backend_list},
                                       query_sizes=args.queries, repeats=args.repeats, warmup=args.warmup,
                                       seed=args.seed, progress=_progress(args), noise_target=args.noise_target,
                                       random_weights=lm.is_random)
        cal = (args.calibrations or {}).get("heads") or drafter_calibration(lm)
        out.update(verify_cost=cost["rows"], verify_cost_meta=cost["meta"], projected=frames.projected_speedup(
            frames.expected_tokens_per_call(cal) if cal else {}, cost["rows"]))
        print(frames.format_rows(cost["rows"]))
        if out["projected"]:
            print("PROJECTION, not a measurement (E(N) of the calibration x t(1)/t(N)):\n"
                  + frames.format_rows(out["projected"]))
    return out


def table_job(args) -> dict:
    """``rvqspec bench table`` and ``bench pipeline``: :func:`bench.table.bench_table` or
    :func:`bench.table.pipeline_table`, printed and written (CSV, Markdown, JSON)."""
    common = dict(models=args.model_list, precisions=args.dtypes, repeats=args.repeats, warmup=args.warmup,
                  acceptance=args.acceptance_table, seed=args.seed, progress=_progress(args),
                  noise_target=args.noise_target)
    if args.job == "table":
        result = bench_table.bench_table(backends=args.backend_list, **common)
    else:
        result = bench_table.pipeline_table(chunk_frames=args.chunk_frames, frames=args.frames, batches=args.batches,
                                            stream_repeats=args.stream_repeats, streams=not args.no_streams,
                                            concurrency=not args.no_streams, **common)
    print(bench_table.format_table(result))
    out = bench_table.save(result, args.table_out, _provenance(args))
    print(f"wrote {out['csv']}, {out['md']}, {out['json']}"
          + "".join(f", {out[k]['csv']}" for k in ("streams", "concurrency") if k in out))
    return result


JOBS = {"latency": latency_job, "precisions": precisions_job, "frames": frames_job, "table": table_job,
        "pipeline": table_job}
