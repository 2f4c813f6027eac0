"""``rvqspec bench JOB`` (and ``make bench``): the parser of the timing jobs (docs/cli.md#rvqspec-bench). The jobs
are :mod:`bench.jobs`, imported when one runs (nothing here imports torch: ``rvqspec --help`` stays fast)."""

from __future__ import annotations

import argparse

from bench import (BACKENDS, MAX_QUERIES, PIPELINE_BATCHES, PIPELINE_CHUNK_FRAMES, PIPELINE_FRAMES, PIPELINE_MODELS,
                   PRECISION_QUERY_SIZES, QUERY_SIZES, TABLE_BACKENDS, TABLE_MODELS, TABLE_REPEATS)
from rvqspec_lib.cli.common import SEED_MAX, add_threads_arg, number

#: The command's help line (``rvqspec bench``: a plug-in of rvqspec_lib.cli.main).
HELP = ("timings, one job each: latency (talker step, code-predictor calls), precisions (each against its floor), "
        "frames (decoders), table (the one to act on), pipeline (the whole frame streamed)")
#: The jobs and their help lines.
JOBS = {
    "latency": "the talker step and code-predictor calls of Q query positions (on the CPU against the floor)",
    "precisions": "the code-predictor call in every precision and backend (with --talker-contexts the talker step "
                  "too), each against its weight-streaming floor",
    "frames": "whole frames of decoders through verify backends, stepped and fused, in one interleaved run (with "
              "--queries the verify cost curve; --device cuda: notebook 07's GPU leg, make bench-gpu)",
    "table": "the table to act on (docs/precision.md#the-table): per precision and backend, per model",
    "pipeline": "the whole frame streamed: talker, inner loop and codec decoder against their floors, time to first "
                "audio, RTF, underruns on one thread and on all cores, concurrent streams (docs/streaming.md)",
}
def _positive_list(what: str, most: int | None = None, not_whole: str | None = None):
    """An argparse type: comma-separated whole numbers >= 1 (at most ``most``), else the one line ``what`` (or
    ``not_whole`` for text that is no number)."""
    def parse(s: str) -> list[int]:
        try:
            vals = [int(v) for v in s.replace(" ", "").split(",") if v]
        except ValueError:
            raise argparse.ArgumentTypeError(not_whole or what) from None
        if not vals or min(vals) < 1 or (most and max(vals) > most):
            raise argparse.ArgumentTypeError(what)
        return vals
    return parse


_int_list = _positive_list(f"query positions are >= 1: give e.g. 1,2,4,8 (at most {MAX_QUERIES})", MAX_QUERIES,
                           "give query positions as comma-separated whole numbers, e.g. 1,2,4,8")
_batch_list = _positive_list("streams run together are whole numbers >= 1: give e.g. 1,2,4")


def _common(p: argparse.ArgumentParser, *, repeats: int, warmup: int, model: bool = True) -> None:
    if model:
        p.add_argument("--model", default="qwen3-tts-0.6b-random",
                       help="embedded (the shipped trained model), tiny-random, qwen3-tts-0.6b-random, "
                            "qwen3-tts-1.7b-random, a checkpoint dir or hub id")
    p.add_argument("--json", dest="json_path", default=None, help="write the full result (+ provenance) here")
    p.add_argument("--repeats", type=int, default=repeats,
                   help=f"timed rounds, every condition once each (median reported; default {repeats})")
    p.add_argument("--noise-target", type=float, default=None, metavar="F",
                   help="--repeats becomes the minimum: rounds go on until every median's relative standard error "
                        "is <= F (e.g. 0.02), or 4 x --repeats (default: exactly --repeats)")
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed runs of each condition first (default "
                   f"{warmup}; compiled backends compile there)")
    p.add_argument("--seed", type=number(int, 0, SEED_MAX, " (2**63 - 1)"), default=0,
                   help="seed of the random weights, inputs and frames")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_threads_arg(p)


def _replay_and_out(p: argparse.ArgumentParser, stem: str, files: str) -> None:
    """The table's and the pipeline's ``--acceptance`` and ``--table-out``."""
    p.add_argument("--acceptance", default=None, metavar="FILE",
                   help="the acceptance the random-weight models replay (default the embedded model's calibration)")
    p.add_argument("--table-out", default=stem, metavar="STEM",
                   help=f"output stem: {files} (+ provenance; default {stem})")


def _flags_of_other_jobs(parsers: dict[str, argparse.ArgumentParser]) -> None:
    """Give each job's parser an ``unknown_flag_hint``: a flag only other jobs take is answered with one line naming
    them."""
    own = {job: {s for a in p._actions for s in a.option_strings} for job, p in parsers.items()}

    def hint_for(job: str):
        def hint(extra: list[str]) -> str | None:
            for arg in extra:
                flag = arg.split("=", 1)[0]
                jobs = [j for j in parsers if flag in own[j]]
                if flag.startswith("--") and jobs and job not in jobs:
                    named = jobs[0] if len(jobs) == 1 else f"{', '.join(jobs[:-1])} and {jobs[-1]}"
                    return (f"{flag} is a flag of rvqspec bench {named}, not of bench {job}: drop it, or run rvqspec "
                            f"bench {jobs[0]} with it")
            return None
        return hint

    for job, p in parsers.items():
        p.unknown_flag_hint = hint_for(job)


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench`` jobs and their options to ``parser`` (returned)."""
    sub = parser.add_subparsers(dest="job", metavar="JOB", title="jobs")
    parsers = {}
    p = parsers["latency"] = sub.add_parser("latency", help=JOBS["latency"], description=JOBS["latency"])
    _common(p, repeats=20, warmup=3)
    p.add_argument("--dtype", default="float32",
                   help="float32, bfloat16, int8 (int8 weights, bfloat16 activations), int8-dynamic (int8 weights "
                        "and per-row int8 activations), float64, float16 (GPUs)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda[:N] or mps")
    p.add_argument("--backend", default="official", help=f"the code-predictor call's verify backend: "
                   f"{', '.join(BACKENDS)}")
    p.add_argument("--queries", type=_int_list, default=list(QUERY_SIZES),
                   help=f"query positions per code-predictor call, comma-separated (default "
                        f"{','.join(map(str, QUERY_SIZES))}; at most {MAX_QUERIES})")
    p.add_argument("--prefix-len", type=int, default=8, help="committed slots before the code-predictor call")
    p.add_argument("--talker-context", type=int, default=64, help="KV prefix of the talker step")

    p = parsers["precisions"] = sub.add_parser("precisions", help=JOBS["precisions"], description=JOBS["precisions"])
    _common(p, repeats=20, warmup=3)
    p.add_argument("--dtype", default=None, help="comma-separated precisions of float32, bfloat16, int8, "
                   "int8-dynamic (docs/precision.md; default those this CPU runs natively)")
    p.add_argument("--backends", default=None, help="comma-separated verify backends the call is timed through "
                   "(default official,native: the official module and the native forward, where it builds)")
    p.add_argument("--queries", type=_int_list, default=list(PRECISION_QUERY_SIZES),
                   help=f"query positions, comma-separated (default {','.join(map(str, PRECISION_QUERY_SIZES))})")
    p.add_argument("--prefix-len", type=int, default=8, help="committed slots before the code-predictor call")
    p.add_argument("--talker-contexts", type=_int_list, default=None, metavar="C,...",
                   help="also the talker step, official and native, per precision after C cached positions (e.g. "
                        "64,512), against its floor, and what the native prefix scan saves (docs/precision.md)")

    p = parsers["frames"] = sub.add_parser("frames", help=JOBS["frames"], description=JOBS["frames"])
    _common(p, repeats=20, warmup=2)
    p.add_argument("--backends", default="eager", help=f"comma-separated verify backends of {', '.join(BACKENDS)} "
                   "(default eager); each times every decoder stepped, and AR and the chains fused (one graph a "
                   "round, or one C call a frame for native)")
    p.add_argument("--decoders", default=None,
                   help="comma-separated decoder names (rvqspec synth --help lists them); default ar, chain:4, the "
                        "default tree and, when the model ships them, tree:calibrated:4, tree:calibrated:16, paper and "
                        "auto")
    p.add_argument("--dtype", default="float32", help="the code predictor's precision: float32, bfloat16, int8, "
                   "int8-dynamic (compile: float32 and bfloat16; onnx: float32)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda[:N] (eager and compile; compile is "
                   "torch.compile reduce-overhead: CUDA graphs)")
    p.add_argument("--acceptance", default=None, metavar="FILE",
                   help="a timing replay of a random-weight model: the acceptance table its frames replay (a "
                        "calibration file, or docs/precision.md#timing-replay's JSON); no fused speculative "
                        "rows (a fused frame computes its own acceptance)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="calibrated trees of the reused heads for a model that ships none (e.g. notebook 04's "
                        "figures/04_trees_heads.json): the tree:calibrated:N decoders read them, and so does the "
                        "projection of --queries")
    p.add_argument("--queries", type=_int_list, default=None,
                   help="also one verify call of Q query positions per backend, comma-separated with 1 among them "
                        "(e.g. 1,2,4,8,16,32,64): t(Q)/t(1), and with calibrated trees the PROJECTED speedup "
                        "E(N) t(1)/t(N)")

    p = parsers["table"] = sub.add_parser("table", help=JOBS["table"], description=JOBS["table"])
    _common(p, repeats=TABLE_REPEATS, warmup=1, model=False)
    p.add_argument("--models", default=",".join(TABLE_MODELS),
                   help=f"comma-separated models (default {','.join(TABLE_MODELS)}; a random-weight one is timed as "
                        "a timing replay)")
    p.add_argument("--dtype", default=None, help="comma-separated precisions (default those this CPU runs natively)")
    p.add_argument("--backends", default=",".join(TABLE_BACKENDS),
                   help=f"comma-separated backends of eager, native, compile, onnx (default {','.join(TABLE_BACKENDS)};"
                        " compile adds minutes per call shape on a small CPU)")
    _replay_and_out(p, "build/bench_table", "STEM.csv, STEM.md, STEM.json")

    p = parsers["pipeline"] = sub.add_parser("pipeline", help=JOBS["pipeline"], description=JOBS["pipeline"])
    _common(p, repeats=TABLE_REPEATS, warmup=1, model=False)
    p.add_argument("--models", default=",".join(PIPELINE_MODELS),
                   help=f"comma-separated models (default {','.join(PIPELINE_MODELS)}; a random-weight one is a timing "
                        "replay: its speculative frames replay a trained model's acceptance, its codec is the "
                        "real-size decoder with random weights)")
    p.add_argument("--dtype", default=None, help="comma-separated precisions of the talker and the code predictor "
                   "(default those this CPU runs natively); the codec decoder runs in bfloat16 where the CPU has "
                        "it, else float32")
    p.add_argument("--chunk-frames", type=int, default=PIPELINE_CHUNK_FRAMES,
                   help=f"frames decoded to audio at once (default {PIPELINE_CHUNK_FRAMES})")
    p.add_argument("--frames", type=int, default=PIPELINE_FRAMES,
                   help=f"frame cap of each measured stream (default {PIPELINE_FRAMES}: 3.2 s of audio)")
    p.add_argument("--batches", type=_batch_list, default=list(PIPELINE_BATCHES),
                   help=f"streams run together in the concurrency rows, comma-separated (default "
                        f"{','.join(map(str, PIPELINE_BATCHES))})")
    p.add_argument("--stream-repeats", type=int, default=2, help="runs of each measured stream (default 2)")
    p.add_argument("--no-streams", action="store_true", help="the parts only: no measured streams, no concurrency")
    _replay_and_out(p, "build/pipeline", "STEM.csv, .md, .json, STEM_streams.*, STEM_concurrency.*")

    _flags_of_other_jobs(parsers)

    parser.set_defaults(job=None, threads=None)
    return parser


def run(args: argparse.Namespace, threads: int) -> int:
    """Run the job of parsed :func:`add_args` options (:func:`bench.jobs.run_job`); returns the exit
    status.

    Raises:
        ValueError: no job, a bad flag (one line naming the fix).
    """
    if args.job is None:
        raise ValueError("give a job: rvqspec bench latency, precisions, frames, table or pipeline (rvqspec bench "
                         "--help says what each does)")
    from bench import jobs as bench_jobs  # here, not above: it imports torch (rvqspec --help must not)

    return bench_jobs.run_job(args, threads)
