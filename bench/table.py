"""The one table a user acts on, per model (the real-size 0.6B architecture has random weights, timing only: its
speculative frames a timing replay, :mod:`rvqspec_lib.eval.replay`), precision and backend: the inner-loop frame's
rows of :data:`ROWS` (stepped and fused AR, the fastest stepped and fused speculative frames, ``auto``'s pick) against
the AR frame's weight-streaming floor (``rvqspec bench table``, ``make bench``, notebook 07;
docs/precision.md#the-table), and the whole frame streamed, :data:`PIPELINE_ROWS` on the native backend: talker step,
inner loop and codec decoder against their floors, on one thread and all cores, measured streams and B streams batched
(``rvqspec bench pipeline``, notebook 06; docs/streaming.md#the-pipeline-table). Public ports' figures are quoted
(:data:`PUBLIC_PORTS`, :data:`PUBLIC_PIPELINES`), never measured here."""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
import statistics
import time
from typing import Sequence

import torch

from rvqspec_lib.common.machine import cpu_model
from rvqspec_lib.common.provenance import save_json, save_table
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.decoding.decoder_names import check_decoder_names
from rvqspec_lib.eval import noise
from rvqspec_lib.eval.budget import choose_decoder
from rvqspec_lib.eval.replay import default_acceptance
from rvqspec_lib.eval.speed import random_contexts, time_frames
from rvqspec_lib.eval.timing import Phases, bandwidth_around, interleaved, oversubscribed_note, summary
from rvqspec_lib.models import loader  # loader.load_model, looked up at call time (tests replace it)
from rvqspec_lib.models.backends import (available, frame_runner, fused_support, runner_fields, runner_label,
                                         verify_backend)
from rvqspec_lib.models.configs import build_codec_decoder
from rvqspec_lib.models.named_decoders import drafter_calibration, resolve_all
from rvqspec_lib.models.streaming import codec_stream_for, synthesize_stream
from rvqspec_lib.models.tree_files import load_calibration, tree_file
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.device.precision import (ACTIVATION_DTYPE, apply_precision, check_precision, cpu_features,
                                          native_precisions)
from rvqspec_lib.device.streaming_codec import StreamingCodecDecoder
import bench  # the defaults the parser shows: bench.TABLE_MODELS, bench.PIPELINE_FRAMES, ...
from bench.floor import call_weight_bytes, codec_floor_ms, floor_ms, peak_gflops, talker_step_bytes
from bench.frames import fastest, format_rows
from bench.latency import native_step

#: Backends the table knows: the CPU ones of the registry that time whole frames.
TIMED_BACKENDS = ("eager", "native", "compile", "onnx")
#: Backends that time every decoder (they build in seconds); the others time AR and the full backends' picks.
FULL_BACKENDS = ("eager", "native")
#: Chain windows and calibrated-tree node budgets timed for the speculative rows.
DEFAULT_CHAINS = (3, 4, 6)
DEFAULT_BUDGETS = (4, 8, 16)
#: Milliseconds of audio one frame holds (12.5 Hz): the real-time budget of a frame.
FRAME_MS = 80.0
#: Published figures of public ports (quoted, not measured here): shown under the table, labelled.
PUBLIC_PORTS = (
    "public C port, EPYC 9555P, 0.6B, 1 thread: 164.8 ms/frame bf16, 79.3 ms/frame int8 "
    "(gabriele-mastrapasqua/qwen3-tts docs/x86-optimization.md; quoted, not measured here)",
    "public GPU ports (quoted, not measured here): faster-qwen3-tts 26 ms/frame on a Jetson Orin (CUDA graphs); "
    "vllm-omni 6.5 ms/frame",
)
#: The rows of each (model, precision, backend) of the table, and of each (model, precision) of the pipeline (its AR
#: is the fused native frame).
ROWS = ("stepped AR", "fused AR", "best speculative", "fused speculative", "auto")
PIPELINE_ROWS = ("AR", "best speculative", "auto")
#: The decoder's fields of a row (:func:`rvqspec_lib.models.backends.runner_fields`, less backend and precision).
DECODER_FIELDS = ("decoder", "kind", "drafter", "nodes", "lossy", "fused")
#: The issue's target for the fused speculative frame: at most this multiple of the fused AR frame's (>= 1.5x
#: faster), same model, precision and backend (issue 17).
FUSED_TARGET = 0.67
#: Why a timing replay has no fused speculative row.
REPLAY_NO_FUSED = "a timing replay cannot drive a fused frame (its acceptance is inside it)"
#: What a backend that fails to build or run a precision becomes: a row saying why, not a crash.
_FAILURES = (RuntimeError, NotImplementedError, ValueError, TypeError)
#: The sentence every measured stream speaks.
TEXT = "The weather is fine today, and we are going for a long walk by the river."
#: Talker positions cached before the timed step: a prompt and a few seconds of speech.
CONTEXT = 96
#: Frames pushed before the codec is timed: past the released decoder's 72-frame attention window.
CODEC_WARMUP_FRAMES = 80
#: The two ways a stream runs: in turn on one thread, or overlapped over all cores.
LAYOUTS = ("1 thread", "all cores")
#: Published end-to-end figures of public ports (QUOTED, not measured here): their own rows and columns.
PUBLIC_PIPELINES = tuple(dict(zip(("source", "device", "model", "precision", "quoted_rtf", "quoted_ttfa_ms"), q))
                         for q in (
    ("C port of Qwen3-TTS (quoted)", "AMD EPYC 9555P", "0.6B", "", "0.95", ""),
    ("C port of Qwen3-TTS (quoted)", "Apple M1", "0.6B", "int8 / int4", "0.52-0.69", "460 (streaming)"),
    ("faster-qwen3-tts (quoted)", "RTX 4090", "", "", "", "156"),
    ("faster-qwen3-tts (quoted)", "Jetson Orin", "", "", "", "597")))
#: The parts of a frame the pipeline times.
PARTS = ("talker", "inner", "codec")


def decoder_names(chains: Sequence[int], budgets: Sequence[int]) -> list[str]:
    """The table's decoders as names: ``ar``, ``chain:W`` per window, ``tree:calibrated:N`` per budget."""
    return ["ar", *(f"chain:{int(w)}" for w in chains), *(f"tree:calibrated:{int(n)}" for n in budgets)]


def table_decoders(lm, chains: Sequence[int], budgets: Sequence[int], *, n_contexts: int, seed: int):
    """What a table times on ``lm``: ``(contexts, calibration, named)``: ``n_contexts`` contexts of the shipped
    evaluation split (random ones for random weights), the heads calibration beside the model (else the embedded
    model's), and :func:`decoder_names` resolved with it."""
    cp = lm.code_predictor.eval()
    contexts = random_contexts(cp, n_contexts, seed=seed) if lm.is_random else \
        frames_from_shipped(lm, "evaluation", max_frames=n_contexts, seed=seed).context
    cal = drafter_calibration(lm, "heads") or load_calibration(tree_file("embedded", "heads"), n_codes=15,
                                                                drafter="heads")
    return contexts, cal, resolve_all(decoder_names(chains, budgets), lm, calibrations={"heads": cal})


def check_table_args(models: Sequence[str], precisions: Sequence[str], backends: Sequence[str] = ("native",), *,
                     chains: Sequence[int] = DEFAULT_CHAINS, budgets: Sequence[int] = DEFAULT_BUDGETS,
                     chunk_frames: int | None = None, frames: int = bench.PIPELINE_FRAMES, batches: Sequence[int] = (1,)) -> None:
    """Every check of the table or (``chunk_frames`` given) the pipeline that needs no model: known, present backends,
    each once (the pipeline's: the native forward); precisions the CPU runs natively (the table: float32 among them);
    the decoders' names; model names; the pipeline's chunk within its frame cap, and its batches.

    Raises:
        ValueError: one line naming the fix.
    """
    pipeline = chunk_frames is not None
    for b in backends:
        if b not in TIMED_BACKENDS:
            raise ValueError(f"--backends {b!r}: the table times {', '.join(TIMED_BACKENDS)} (cuda: "
                             "rvqspec bench frames --device cuda; coreml: notebook 06 on a Mac)")
        ok, why = available(b)
        if not ok:
            raise ValueError(f"the pipeline runs the native talker and inner loop, and {why}" if pipeline else
                             f"--backends {b} is not available here: {why}")
    if len(set(backends)) != len(backends):
        raise ValueError(f"--backends {','.join(backends)}: name each backend once")
    for p in precisions:
        check_precision(p)
    if not pipeline and "float32" not in precisions:
        raise ValueError("the table always has float32 (the reference precision): add it to --dtype")
    check_decoder_names(decoder_names(chains, budgets))
    for m in models:
        loader.model_facts(m)
    if pipeline and not 1 <= int(chunk_frames) <= int(frames):
        raise ValueError(f"--chunk-frames must be in 1..--frames ({frames}), got {chunk_frames}")
    if pipeline and (not batches or min(batches) < 1):
        raise ValueError(f"--batches are streams run together, each >= 1: give e.g. 1,2,4, got {list(batches)}")


def choose_auto(cp, calibration: dict, contexts, backends: dict, *, oracle, frames: int, budgets: Sequence[int],
                seed: int):
    """``auto``'s pick timed on the spot (:func:`~rvqspec_lib.eval.budget.choose_decoder`, a shortlist of three) for
    the table and the pipeline: ``(choice, note)``."""
    c = choose_decoder(cp, calibration, contexts, backends=backends, frames=frames, repeats=1, cost_repeats=3,
                       shortlist=3, seed=seed, budgets=budgets, acceptance=oracle)
    return c, f"auto chose {c.label}{', fused' if c.fused else ''}"


def _row(head: dict, name: str, r: dict | None, note: str, fused_ms: float | None, floor_bytes: int,
         build_s: float | None = None) -> dict:
    """One row of the table from a :func:`time_frames` row (``None``: absent)."""
    r = r or {}
    ms = r.get("ms_per_frame")
    return {**head, "row": name, **{k: r.get(k) for k in (*DECODER_FIELDS, "ms_per_frame", "p10_ms", "p90_ms")},
            "rtf": ms / FRAME_MS if ms else None, "tokens_per_call": r.get("tokens_per_call"),
            "speedup_vs_ar": r.get("speedup_vs_ar"), "x_fused_ar": ms / fused_ms if ms and fused_ms else None,
            "floor_ar_ms": floor_bytes, "x_floor_ar": None, "build_s": build_s, "note": note}


def _backend_rows(bname: str, cp, named: dict, contexts, calibration: dict, *, head: dict, floor_bytes: int,
                  oracle, picks: dict | None, auto: bool, opts: dict) -> tuple[list, dict, dict]:
    """Time one (model, precision, backend): its five rows, the :func:`time_frames` result and its picks for later
    backends."""
    full = bname in FULL_BACKENDS or picks is None
    verify = verify_backend(bname, cp)
    stepped = [k for k in named if full or k in ("ar", picks["best"])]
    replayed = REPLAY_NO_FUSED if oracle is not None else None
    no_fused = {k: fused_support(bname, named[k].decoder) or (replayed if k != "ar" else None)
                for k in named if named[k].name.kind in ("ar", "chain")}
    fused = [k for k, why in no_fused.items() if why is None and (full or k in ("ar", picks["fused"]))]
    runners = [frame_runner(bname, cp, named[k], verify=verify, acceptance=oracle) for k in stepped] + \
        [frame_runner(bname, cp, named[k], fused=True, verify=verify) for k in fused]
    auto_note, auto_key = "absent: auto not timed", None
    if auto:
        if full:
            choice, auto_note = choose_auto(cp, calibration, contexts, {bname: verify}, oracle=oracle,
                                      frames=opts["auto_frames"], budgets=opts["budgets"], seed=opts["seed"])
            pick = (choice.named, choice.fused)
        else:
            pick, auto_note = picks["auto"], f"{picks['auto_note']} (on {picks['backend']})"
        why = fused_support(bname, pick[0].decoder) if pick[1] else None
        if why:
            auto_note = f"absent: {auto_note}; {why}"
        else:
            auto_key = (pick[0].label, pick[1])
            if not any((r.name.label, r.fused) == auto_key for r in runners):
                runners.append(frame_runner(bname, cp, pick[0], fused=pick[1], verify=verify,
                                            acceptance=None if pick[1] else oracle))
    res = time_frames(runners, contexts, repeats=opts["repeats"], warmup=opts["warmup"], seed=opts["seed"],
                      progress=opts["progress"], noise_target=opts["noise_target"], random_weights=oracle is not None)
    by = {(r["decoder"], r["fused"]): r for r in res["rows"]}
    spec = [by[(k, False)] for k in stepped if k != "ar"]
    best = fastest(spec)
    spec_fused = [by[(k, True)] for k in fused if k != "ar"]
    fused_best = fastest(spec_fused)
    built = res["meta"]["prepare_s"].get(f"{fused_best['decoder']}/{bname}") if fused_best else None
    fused_ar = by.get(("ar", True))
    fused_ms = fused_ar["ms_per_frame"] if fused_ar else None
    whose = "" if full else f"the {picks['backend']} rows' "
    chain_why = next((why for k, why in no_fused.items() if k != "ar" and why), "no chain window asked for")
    notes = {"stepped AR": "", "fused AR": "" if fused_ar else f"absent: {no_fused['ar']}",
             "best speculative": f"best of {len(spec)} timed" if full else f"{whose}best",
             "fused speculative": (f"fastest of {len(spec_fused)} fused frames timed" if full
                                   else f"{whose}fastest fused frame") + f"; built in {built:.1f} s"
             if fused_best else f"absent: {chain_why}", "auto": auto_note}
    picked = {"stepped AR": by[("ar", False)], "fused AR": fused_ar, "best speculative": best,
              "fused speculative": fused_best, "auto": by.get(auto_key)}
    rows = [_row(head, name, picked[name], notes[name], fused_ms, floor_bytes,
                 built if name == "fused speculative" else None) for name in ROWS]
    if picks is None:  # the first full backend's: what a later backend times
        picks = {"backend": bname, "best": best and best["decoder"], "fused": fused_best and fused_best["decoder"],
                 "auto": pick if auto else None, "auto_note": auto_note}
    return rows, res, picks


def bench_table(*, models: Sequence[str] = bench.TABLE_MODELS, precisions: Sequence[str] | None = None,
                backends: Sequence[str] = bench.TABLE_BACKENDS, repeats: int = 5, warmup: int = 1,
                chains: Sequence[int] = DEFAULT_CHAINS, budgets: Sequence[int] = DEFAULT_BUDGETS,
                auto: bool = True, auto_frames: int = 4, acceptance=None, n_contexts: int = 8, seed: int = 0, progress: bool = True,
                noise_target: float | None = None) -> dict:
    """Measure the table (docs/precision.md#the-table).

    Args:
        models: model names; a random-weight one is timed as a replay of ``acceptance`` (default
            :func:`rvqspec_lib.eval.replay.default_acceptance`).
        precisions: default the CPU's native ones. backends: some of :data:`TIMED_BACKENDS`, each once.
        repeats, warmup, noise_target: :func:`rvqspec_lib.eval.speed.time_frames`'s, per (model, precision, backend).
            chains, budgets: the speculative decoders (``auto`` chooses among the same budgets). auto, auto_frames:
            time auto's choice.
            n_contexts: contexts decoded in turn (the evaluation split; random ones for random weights). seed:
            contexts, generators, the replay's oracle.

    Returns:
        ``{"rows", "footer", "meta"}``: a row per (model, precision, backend, :data:`ROWS`): ``model``, ``weights``
        (``trained`` or the replay's words), ``precision``, ``backend``, ``row``, :data:`DECODER_FIELDS` (None when
        absent), ``ms_per_frame``, ``p10_ms``, ``p90_ms``, ``rtf``, ``tokens_per_call``, ``speedup_vs_ar``,
        ``x_fused_ar``, ``floor_ar_ms``, ``x_floor_ar``, ``build_s`` (the fused speculative frame's), ``note``;
        ``footer``: :data:`PUBLIC_PORTS`; ``meta``: machine, bandwidth, noise, replay, build seconds,
        :data:`FUSED_TARGET`.

    Raises:
        ValueError: as :func:`check_table_args`; bad noise settings.
    """
    started = time.perf_counter()
    precisions = list(precisions or native_precisions())
    check_table_args(models, precisions, backends, chains=chains, budgets=budgets)
    noise.repeat_cap(noise_target, repeats, None)  # bad settings fail before any model loads
    acceptance = acceptance or default_acceptance()
    opts = {"auto_frames": auto_frames, "budgets": budgets, "seed": seed, "repeats": repeats,
            "warmup": warmup, "progress": progress, "noise_target": noise_target}
    rows, crowded, build, noise_runs = [], [], {}, []

    def measure():
        for model in models:
            lm = loader.load_model(model, dtype="float32", seed=seed)
            base, replay = lm.code_predictor.eval(), bool(lm.is_random)
            contexts, cal, named = table_decoders(lm, chains, budgets, n_contexts=n_contexts, seed=seed)
            for prec in precisions:
                cp = apply_precision(copy.deepcopy(base), prec, require_native=False)
                floor_bytes = (int(base.config.num_code_groups) - 1) * call_weight_bytes(cp)["bytes"]
                picks = None
                for bname in backends:
                    head = {"model": model, "weights": acceptance.text if replay else "trained", "precision": prec,
                            "backend": bname}
                    ok, why = available(bname, prec)
                    try:
                        if not ok:
                            raise RuntimeError(why)
                        mine, res, picks = _backend_rows(
                            bname, cp, named, contexts, cal, head=head, floor_bytes=floor_bytes,
                            oracle=acceptance.oracle(seed) if replay else None, picks=picks, auto=auto, opts=opts)
                    except _FAILURES as e:
                        why = why or f"failed here: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                        rows.extend(_row(head, name, None, f"absent: {why}", None, floor_bytes) for name in ROWS)
                        continue
                    rows.extend(mine)
                    where = f"{model} {prec} {bname}"
                    if oversubscribed_note(res["meta"]):
                        crowded.append(f"{where}: {oversubscribed_note(res['meta'])}")
                    build.update({f"{where} {k}": v for k, v in res["meta"]["prepare_s"].items()})
                    noise_runs.append({"model": model, "precision": prec, "backend": bname,
                                       **{k: res["meta"][k] for k in ("repeats", "max_repeats", "rel_se_max")}})

    _, bandwidth = bandwidth_around(measure)
    for r in rows:  # the AR frame's floor: 15 calls' weight bytes at the faster of the two bandwidths
        r["floor_ar_ms"] = floor_ms(r["floor_ar_ms"], bandwidth["gb_per_s"])
        r["x_floor_ar"] = r["ms_per_frame"] / r["floor_ar_ms"] if r["ms_per_frame"] else None
    meta = {"cpu": cpu_model(), "cpu_flags": cpu_features(), "native_precisions": list(native_precisions()),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "bandwidth": bandwidth, "repeats": repeats, "noise_target": noise_target, "noise": noise_runs,
            "warmup": warmup, "n_contexts": n_contexts, "seed": seed, "chains": list(chains), "budgets": list(budgets),
            "auto": auto, "models": list(models), "precisions": precisions, "backends": list(backends),
            "replay": acceptance.describe(), "replay_text": acceptance.text, "oversubscribed": crowded,
            "fused_build_s": build, "fused_target": FUSED_TARGET, "total_s": time.perf_counter() - started,
            "interleaved": "the runners of each (model, precision, backend) in one interleaved run"}
    return {"rows": rows, "footer": list(PUBLIC_PORTS), "meta": meta}


def _frames_words(m: dict) -> str:
    """How many frames each runner's median is of: the fixed count, or the range a noise target made."""
    runs, target = m.get("noise") or [], m.get("noise_target")
    if target is None or not runs:
        return str(m["repeats"])
    made = sorted(r["repeats"] for r in runs)
    worst = [r["rel_se_max"] for r in runs if r["rel_se_max"] is not None]
    span = f"{made[0]}" if made[0] == made[-1] else f"{made[0]}-{made[-1]}"
    return (f"{span} (noise target {100 * target:.1f} %, at most {runs[0]['max_repeats']}"
            + (f", median's relative standard error <= {100 * max(worst):.1f} %" if worst else "") + ")")


def fastest_by_model(result: dict) -> list[dict]:
    """Per model: the fastest timed row (``fastest``), the fastest AR and speculative rows (``fastest_ar``,
    ``fastest_speculative``; ``None`` when none), and ``speculative_over_ar`` (below 1: speculation wins here)."""
    out = []
    for m in dict.fromkeys(r["model"] for r in result["rows"]):
        timed = [r for r in result["rows"] if r["model"] == m and r["ms_per_frame"]]
        best, ar = fastest(timed), fastest(r for r in timed if r["kind"] == "ar")
        spec = fastest(r for r in timed if r["kind"] not in (None, "ar") and not r["lossy"])
        out.append({"model": m, "fastest": best, "fastest_ar": ar, "fastest_speculative": spec,
                    "speculative_over_ar": spec["ms_per_frame"] / ar["ms_per_frame"] if spec and ar else None})
    return out


def round_costs(result: dict) -> list[dict]:
    """Why speculation gains or loses, where the fused AR and speculative frames were both timed: one round costs
    ``round_over_ar_call = t x (frame time / fused AR frame's)`` AR calls at t tokens per call; speculation wins
    below t.

    Returns:
        rows ``model``, ``precision``, ``backend``, ``decoder``, ``tokens_per_call``, ``x_fused_ar``,
        ``round_over_ar_call``, ``x_floor_ar`` (the fused AR frame against its floor).
    """
    out = []
    for key in dict.fromkeys((r["model"], r["precision"], r["backend"]) for r in result["rows"]):
        mine = {r["row"]: r for r in result["rows"] if (r["model"], r["precision"], r["backend"]) == key}
        ar, spec = mine.get("fused AR"), mine.get("fused speculative")
        if not (ar and spec and ar["ms_per_frame"] and spec["ms_per_frame"] and spec["tokens_per_call"]):
            continue
        x = spec["ms_per_frame"] / ar["ms_per_frame"]
        out.append({"model": key[0], "precision": key[1], "backend": key[2], "decoder": spec["decoder"],
                    "tokens_per_call": spec["tokens_per_call"], "x_fused_ar": x,
                    "round_over_ar_call": spec["tokens_per_call"] * x, "x_floor_ar": ar["x_floor_ar"]})
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The whole frame streamed (rvqspec bench pipeline)
# ---------------------------------------------------------------------------------------------------------------------


class PlaceholderCodes:
    """A TIMING REPLAY's runner made streamable: its sealed frames (codes -1) get code 0, so that the talker can be
    fed and the codec timed; the audio is discarded. Every other attribute is the runner's."""

    def __init__(self, runner):
        self.runner = runner

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def __call__(self, context: torch.Tensor, generator: torch.Generator | None = None):
        res = self.runner(context, generator)
        return dataclasses.replace(res, codes=res.codes.clamp_min(0))


@dataclasses.dataclass
class Setup:
    """One (model, precision) ready to run: the converted model, native talker and verify backend, decoders,
    contexts, the replay's oracle (random weights) and the codec."""

    model: str
    precision: str
    lm: object
    talker: NativeTalker
    verify: object
    named: dict
    calibration: dict
    contexts: torch.Tensor
    oracle: object
    codec_decoder: object  # the official decoder module (real size), or None: the model's own codec
    chunk_frames: int

    @property
    def weights(self) -> str:
        return self.oracle.text if self.oracle is not None else "trained"

    def codec_stream(self, batch: int = 1):
        """A fresh streaming decoder of this setup's codec for ``batch`` rows (its weights laid out once)."""
        if self.codec_decoder is not None:
            return StreamingCodecDecoder(self.codec_decoder, batch, chunk_frames_hint=self.chunk_frames)
        return codec_stream_for(self.lm, batch_size=batch, chunk_frames=self.chunk_frames)

    def runner(self, key: str, fused: bool):
        """The native frame runner of decoder ``key``; a replay's stepped speculative runner replays the oracle and
        streams placeholder codes (AR accepts nothing: it runs as it is)."""
        cp, nd = self.lm.code_predictor, self.named[key]
        if fused or self.oracle is None or nd.name.kind == "ar":
            return frame_runner("native", cp, nd, fused=fused, verify=self.verify)
        return PlaceholderCodes(frame_runner("native", cp, nd, verify=self.verify, acceptance=self.oracle))


def build_setup(model: str, precision: str, *, acceptance, chunk_frames: int = bench.PIPELINE_CHUNK_FRAMES,
                seed: int = 0, n_contexts: int = 8, chains: Sequence[int] = DEFAULT_CHAINS,
                budgets: Sequence[int] = DEFAULT_BUDGETS,
                codecs: dict | None = None, max_context: int = 512, codec_config: str = "released") -> Setup:
    """Load and convert ``model`` in ``precision`` and build what :func:`time_parts` and :func:`time_streams` run.

    Args:
        acceptance: the replay's table for a random-weight model. chains, budgets: the speculative candidates.
        codecs: ``{dtype: official decoder}`` cache of the real-size codec (random weights). codec_config: the
            official decoder's config for a model without a codec, ``released`` (``tiny`` in tests); it runs in
            bfloat16 where the CPU runs that natively, else float32.
        max_context: the native talker's KV capacity.
    """
    lm = loader.load_model(model, dtype=ACTIVATION_DTYPE[precision], seed=seed)
    apply_precision(lm.model.talker, precision, require_native=False)  # the WHOLE talker; the CPU checked before
    contexts, cal, named = table_decoders(lm, chains, budgets, n_contexts=n_contexts, seed=seed)
    codec = None
    if lm.speech_tokenizer is None:  # a random-size model: the real-size official decoder, random weights
        # bfloat16 where the CPU runs it natively (about half float32's time, docs/codec_streaming.md), whatever the
        # talker's precision: the codec is a separate model, and a deployment runs each part at its fastest
        dtype = ACTIVATION_DTYPE["bfloat16" if "bfloat16" in native_precisions() else "float32"]
        codecs = {} if codecs is None else codecs
        if dtype not in codecs:
            codecs[dtype] = build_codec_decoder(codec_config, seed=seed, dtype=dtype)
        codec = codecs[dtype]
    return Setup(model, precision, lm, NativeTalker(lm, max_context=max_context),
                 verify_backend("native", lm.code_predictor), named, cal, contexts,
                 acceptance.oracle(seed) if lm.is_random else None, codec, int(chunk_frames))


def candidates(setup: Setup) -> dict[tuple[str, bool], object]:
    """``{(label, fused): runner}``: AR as the native whole frame, every speculative decoder stepped, and the fused
    native chains where the model is trained (a fused frame decides acceptance inside, so no replay drives it)."""
    out = {("ar", True): setup.runner("ar", True)}
    for key, nd in setup.named.items():
        if key == "ar":
            continue
        out[(key, False)] = setup.runner(key, False)
        if setup.oracle is None and fused_support("native", nd.decoder) is None:
            out[(key, True)] = setup.runner(key, True)
    return out


def time_parts(setup: Setup, runners: dict, *, repeats: int = 5, warmup: int = 1, seed: int = 0,
               noise_target: float | None = None, progress: bool = False) -> dict:
    """The parts of a frame, interleaved: ``{"talker": stats, ("inner", label, fused): stats, "codec": stats,
    "meta"}``; stats: ``ms``, ``cpu_ms`` (medians per frame), ``p10_ms``, ``p90_ms``, and for the inner loop
    ``tokens_per_call``, ``calls_per_frame``."""
    talker, crop = native_step(setup.talker, CONTEXT, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    codec = setup.codec_stream(1)
    n = setup.chunk_frames
    official = isinstance(codec, StreamingCodecDecoder)
    warm = CODEC_WARMUP_FRAMES if official else 24  # the embedded codec: past its 16 + 3 frames of window
    codes = torch.randint(0, int(codec.codebook_size), (1, int(codec.n_codebooks), warm + 64 * n), generator=gen)
    with torch.inference_mode():
        codec.push(codes[..., :warm])
    at = [warm]

    def decode(_i):
        p = at[0]
        at[0] = warm + (p - warm + n) % (codes.shape[2] - warm - n + 1)
        with torch.inference_mode():
            return codec.push(codes[..., p:p + n])

    def inner(r):
        def run(i):
            k = i % setup.contexts.shape[0]
            with torch.inference_mode():
                res = r(setup.contexts[k:k + 1], torch.Generator().manual_seed(seed + i))
            return float(res.tokens_per_call.mean()), float(res.calls.float().mean())
        return run

    conds = {"talker": talker, "codec": decode, **{("inner", *k): inner(r) for k, r in runners.items()}}
    for r in runners.values():
        if r.fused:
            r.prepare(1)
    t = interleaved(conds, repeats=repeats, warmup=warmup, noise_target=noise_target, seed=seed,
                    reset={"talker": crop}, progress=progress,
                    desc=f"parts {setup.model} {setup.precision}", module=setup.lm.code_predictor,
                    random_weights=setup.oracle is not None)
    out = {"meta": t.meta}
    for k in conds:
        per = n if k == "codec" else 1
        s = summary([x / per for x in t.ms[k]])
        out[k] = {"ms": s["median_ms"], "p10_ms": s["p10_ms"], "p90_ms": s["p90_ms"],
                  "cpu_ms": statistics.median(t.cpu_ms[k]) / per}
        if k[0] == "inner":
            got = t.out[k][:repeats]  # over the rounds every run makes (docs/reproducibility.md)
            out[k].update(tokens_per_call=statistics.fmean(g[0] for g in got),
                          calls_per_frame=statistics.fmean(g[1] for g in got))
    return out


def _parts_row(setup: Setup, parts: dict, name: str, key: tuple, runner, note: str, codec_floor_ms) -> dict:
    """One pipeline row before :func:`_finish`: the parts of runner ``key`` = ``(label, fused)``."""
    inner, fields = parts[("inner", *key)], runner_fields(runner)
    mine = {"talker": parts["talker"], "inner": inner, "codec": parts["codec"]}
    row = {"model": setup.model, "weights": setup.weights, "precision": setup.precision,
           "codec_dtype": str(next(iter(setup.codec_decoder.parameters())).dtype).replace("torch.", "")
           if setup.codec_decoder is not None else "its own (float32)", "row": name,
           **{k: fields.get(k) for k in ("decoder", "kind", "nodes", "fused", "backend")},
           "tokens_per_call": inner["tokens_per_call"], **{f"{p}_ms": v["ms"] for p, v in mine.items()},
           **{f"{p}_cpu_ms": v["cpu_ms"] for p, v in mine.items()}, "codec_floor_ms": codec_floor_ms, "note": note}
    # bytes of the floors (their ms come once the bandwidth is known: _finish)
    step = talker_step_bytes(setup.lm.model.talker, context=CONTEXT, kv_element_bytes=setup.talker.kv_dtype.itemsize)
    row["talker_bytes"] = step["bytes"] + step["kv_bytes"]
    row["inner_bytes"] = inner["calls_per_frame"] * call_weight_bytes(setup.lm.code_predictor)["bytes"]
    return row


def _finish(rows: list[dict], gb_per_s: float) -> None:
    """Floors, multiples, the frame on one thread and two cores, shares, gains over AR and :func:`what_moves`, in
    place."""
    ar = {(r["model"], r["precision"]): r for r in rows if r["row"] == "AR"}
    for r in rows:
        r["talker_floor_ms"] = floor_ms(r.pop("talker_bytes"), gb_per_s)
        r["inner_floor_ms"] = floor_ms(r.pop("inner_bytes"), gb_per_s)
        for p in PARTS:
            fl = r[f"{p}_floor_ms"]
            r[f"{p}_x_floor"] = r[f"{p}_ms"] / fl if fl else None
            r[f"{p}_cpu_x_floor"] = r[f"{p}_cpu_ms"] / fl if fl else None
        gen, codec = r["talker_ms"] + r["inner_ms"], r["codec_ms"]
        r["frame_1t_ms"], r["frame_2c_ms"] = gen + codec, max(gen, codec)
        gen_cpu = r["talker_cpu_ms"] + r["inner_cpu_ms"]
        r["frame_1t_cpu_ms"], r["frame_2c_cpu_ms"] = gen_cpu + r["codec_cpu_ms"], max(gen_cpu, r["codec_cpu_ms"])
        r["rtf_1t"], r["rtf_2c"] = r["frame_1t_ms"] / FRAME_MS, r["frame_2c_ms"] / FRAME_MS
        for p in PARTS:
            r[f"{p}_share"] = r[f"{p}_ms"] / r["frame_1t_ms"]
        a = ar[(r["model"], r["precision"])]
        r["inner_gain"] = a["inner_ms"] / r["inner_ms"]
        r["frame_gain_1t"] = a["frame_1t_ms"] / r["frame_1t_ms"]
        r["frame_gain_2c"] = a["frame_2c_ms"] / r["frame_2c_ms"]
        r.update(what_moves(r))


def what_moves(r: dict) -> dict:
    """Amdahl on one row: the ``dominant`` part (the largest share of the one-thread frame) and its
    ``dominant_share``; the ``headroom_part``, the part furthest above its floor in ms (``None`` when no part has a
    floor), and ``frame_1t_at_floor_ms``, the frame with that part at its floor (``None`` without one);
    ``bottleneck_2c`` (generation or codec decoding) and the sentence ``moves_frame``. The largest share and the most
    headroom can be different parts: a part can take most of the frame and already run near its floor."""
    part = max(PARTS, key=lambda p: r[f"{p}_ms"])
    over = {p: r[f"{p}_ms"] - r[f"{p}_floor_ms"] for p in PARTS if r.get(f"{p}_floor_ms")}
    room = max(over, key=over.get) if over else None
    at_floor = r["frame_1t_ms"] - over[room] if room else None
    gen = r["talker_ms"] + r["inner_ms"]
    side = "generation" if gen >= r["codec_ms"] else "codec decoding"
    names = {"talker": "the talker step", "inner": "the inner loop", "codec": "the codec decoder"}
    share = f"{100 * r[f'{part}_share']:.0f}% of the frame"
    if room is None:
        one = f"{names[part]} ({share}, the largest share; no floor computed for any part)"
    elif room == part:
        one = (f"{names[part]} ({share}, the largest share and the furthest above its floor: at its floor the frame "
               f"would be {at_floor:.0f} ms, not {r['frame_1t_ms']:.0f})")
    else:
        one = (f"{names[room]}, the furthest above its floor of the parts with one ({over[room]:.1f} ms over it: "
               f"at its floor the frame would be {at_floor:.0f} ms, not {r['frame_1t_ms']:.0f}), though "
               f"{names[part]} is the largest share ({share}"
               + ("" if part in over else "; no floor computed for it") + ")")
    words = (f"one thread: {one}; all cores: {side} ({gen:.0f} ms talker + inner loop against "
             f"{r['codec_ms']:.0f} ms codec)")
    return {"dominant": part, "dominant_share": r[f"{part}_share"], "headroom_part": room,
            "frame_1t_at_floor_ms": at_floor, "bottleneck_2c": side, "moves_frame": words}


def _stream_condition(setup: Setup, runner, codec, *, batch: int, layout: str, text: str, frames: int, seed: int):
    """One timed condition: a whole stream of ``batch`` copies of ``text``; returns its summary and chunk records."""
    def run(i):
        outer = torch.get_num_threads()
        torch.set_num_threads(1 if layout == LAYOUTS[0] else os.cpu_count() or 1)
        try:
            st = synthesize_stream(setup.lm, text if batch == 1 else [text] * batch, runner=runner,
                                   talker=setup.talker, codec_stream=codec, chunk_frames=setup.chunk_frames,
                                   generator=torch.Generator().manual_seed(seed + i), max_frames=frames,
                                   overlap=layout == LAYOUTS[1], language="english")
            for _ in st:
                pass
            return st.summary(), st.chunks
        finally:
            torch.set_num_threads(outer)
    return run


def time_streams(setup: Setup, runners: dict, *, batches: Sequence[int] = (1,), text: str = TEXT,
                 frames: int = bench.PIPELINE_FRAMES, repeats: int = 2, seed: int = 0, progress: bool = False) -> dict:
    """Whole streams of every ``{name: runner}`` x batch x layout (:data:`LAYOUTS`), interleaved, no untimed run first.

    Returns:
        ``{"rows": [...], "meta"}``; a row per condition: ``row``, ``batch``, ``layout``, the decoder's fields, the
        medians of the stream summary's fields, ``realtime`` (a round at most 80 ms), ``chunks`` (the first run's).
    """
    codecs = {b: setup.codec_stream(b) for b in batches}
    conds = {(name, b, layout): _stream_condition(setup, r, codecs[b], batch=b, layout=layout, text=text,
                                                  frames=frames, seed=seed)
             for name, r in runners.items() for b in batches for layout in LAYOUTS}
    t = interleaved(conds, repeats=repeats, warmup=0, seed=seed, progress=progress,
                    desc=f"streams {setup.model} {setup.precision}", random_weights=setup.oracle is not None)
    rows = []
    for (name, b, layout), runs in t.out.items():
        outs = [o for o, _ in runs]
        med = {k: statistics.median(o[k] for o in outs) for k in
               ("ttfa_ms", "ttfa_call_ms", "rtf", "frame_ms", "underruns", "stall_ms", "overlap", "talker_ms",
                "inner_ms", "codec_ms", "generate_cpu_ms", "decode_cpu_ms", "tokens_per_call", "audio_s", "frames")}
        fields = runner_fields(runners[name])
        rows.append({"model": setup.model, "weights": setup.weights, "precision": setup.precision, "row": name,
                     "batch": b, "layout": layout, **{k: fields[k] for k in ("decoder", "kind", "fused")}, **med,
                     "wall_ms": statistics.median(t.ms[(name, b, layout)]), "runs": len(outs),
                     "realtime": bool(med["frame_ms"] <= FRAME_MS), "replay": outs[0]["replay"],
                     "sample_rate": codecs[b].sample_rate, "chunks": runs[0][1]})
    return {"rows": rows, "meta": t.meta}


def sustained(rows: Sequence[dict]) -> list[dict]:
    """Per (model, precision, row, layout) of :func:`time_streams` rows: the most streams batched in real time
    (``streams``; 0 if none) and the time to first audio there."""
    out = {}
    for r in rows:
        k = (r["model"], r["precision"], r["row"], r["layout"])
        best = out.setdefault(k, {"model": k[0], "precision": k[1], "row": k[2], "layout": k[3], "decoder":
                                  r["decoder"], "streams": 0, "ttfa_ms": None, "batches": []})
        best["batches"].append(r["batch"])
        if r["realtime"] and r["batch"] > best["streams"]:
            best.update(streams=r["batch"], ttfa_ms=r["ttfa_ms"])
    return list(out.values())


def pipeline_table(*, models: Sequence[str] = bench.PIPELINE_MODELS, precisions: Sequence[str] | None = None,
                   chunk_frames: int = bench.PIPELINE_CHUNK_FRAMES, frames: int = bench.PIPELINE_FRAMES,
                   batches: Sequence[int] = bench.PIPELINE_BATCHES,
                   repeats: int = 5, warmup: int = 1, stream_repeats: int = 2, chains: Sequence[int] = DEFAULT_CHAINS,
                   budgets: Sequence[int] = DEFAULT_BUDGETS, auto_frames: int = 4,
                   acceptance=None, n_contexts: int = 8, text: str = TEXT, seed: int = 0,
                   noise_target: float | None = None, streams: bool = True, concurrency: bool | Sequence[str] = True,
                   codec_config: str = "released", progress: bool = False) -> dict:
    """Measure the pipeline table (docs/streaming.md#the-pipeline-table).

    Args:
        models: a random-weight one is a timing replay of ``acceptance`` (default
            :func:`rvqspec_lib.eval.replay.default_acceptance`). precisions: default the CPU's native ones.
        chunk_frames, frames, batches: frames per codec chunk, a stream's frame cap, streams batched.
        repeats, warmup, noise_target: the parts' timing. stream_repeats: runs of each stream.
        chains, budgets, auto_frames: the speculative candidates and ``auto``'s pick. streams, concurrency:
            measure them (``concurrency`` may name models). codec_config: as :func:`build_setup`.
            n_contexts: inner-loop contexts. text: what the streams speak.

    Returns:
        ``{"rows", "streams", "concurrency", "sustained", "quoted", "meta"}``: a row per (model, precision,
        :data:`PIPELINE_ROWS`) with per part ``_ms``, ``_cpu_ms``, ``_floor_ms``, ``_x_floor``, ``_cpu_x_floor``, ``_share``;
        ``frame_1t_ms``, ``rtf_1t``, ``frame_2c_ms``, ``rtf_2c`` (and ``_cpu_ms``), ``inner_gain``,
        ``frame_gain_1t``, ``frame_gain_2c``, :func:`what_moves`' fields, ``tokens_per_call``, the decoder's fields,
        ``weights`` (``trained`` or the replay's words), ``note``; ``streams`` and ``concurrency``:
        :func:`time_streams` rows; ``sustained``: :func:`sustained`; ``quoted``: :data:`PUBLIC_PIPELINES`.

    Raises:
        ValueError: as :func:`check_table_args`; bad noise settings.
    """
    phase = Phases()  # seconds each phase took (the run-time budget of a notebook), and the total
    precisions = list(precisions or native_precisions())
    check_table_args(models, precisions, chains=chains, budgets=budgets, chunk_frames=chunk_frames, frames=frames,
                     batches=batches)
    noise.repeat_cap(noise_target, repeats, None)
    acceptance = acceptance or default_acceptance()
    rows, stream_rows, conc_rows, metas, peaks, codecs = [], [], [], [], {}, {}

    def measure():
        for model in models:
            best = None  # (frame ms, setup, runners): the fastest precision's, kept for the streams
            for prec in precisions:
                with phase("build"):
                    setup = build_setup(model, prec, acceptance=acceptance, chunk_frames=chunk_frames, seed=seed,
                                        n_contexts=n_contexts, chains=chains, budgets=budgets, codecs=codecs,
                                        max_context=max(512, frames + 256), codec_config=codec_config)
                    runners = candidates(setup)
                with phase("auto"):  # the pick joins the setup's decoders
                    choice, note = choose_auto(setup.lm.code_predictor, setup.calibration, setup.contexts,
                                               {"native": setup.verify}, oracle=setup.oracle, frames=auto_frames,
                                               budgets=budgets, seed=seed)
                    setup.named.setdefault(choice.label, choice.named)
                    auto_key = (choice.label, bool(choice.fused))
                    runners.setdefault(auto_key, setup.runner(*auto_key))
                with phase("parts"):
                    parts = time_parts(setup, runners, repeats=repeats, warmup=warmup, seed=seed,
                                       noise_target=noise_target, progress=progress)
                metas.append({"model": model, "precision": prec, **{k: parts["meta"].get(k) for k in (
                    "other_cpu_frac", "repeats", "rel_se_max", "threads")}, "note": oversubscribed_note(parts["meta"])})
                codec_floor = None
                if setup.codec_decoder is not None:
                    dt = str(next(setup.codec_decoder.parameters()).dtype)
                    with phase("codec peak"):
                        if dt not in peaks:
                            peaks[dt] = peak_gflops(setup.codec_decoder)["peak_gflops"]
                    codec_floor = codec_floor_ms(setup.codec_decoder, peaks[dt])
                spec = [k for k in runners if k[0] != "ar"]
                fastest = min(spec, key=lambda k: parts[("inner", *k)]["ms"])
                picks = {"AR": (("ar", True), "the native AR frame (one C call)"),
                         "best speculative": (fastest, f"fastest of {len(spec)} speculative decoders timed"
                                              + ("; stepped, acceptance replayed" if setup.oracle else "")),
                         "auto": (auto_key, note)}
                mine = [_parts_row(setup, parts, name, picks[name][0], runners[picks[name][0]], picks[name][1], codec_floor)
                        for name in PIPELINE_ROWS]
                rows.extend(mine)
                frame = min(r["talker_cpu_ms"] + r["inner_cpu_ms"] + r["codec_cpu_ms"] for r in mine)  # robust to load
                if streams and (best is None or frame < best[0]):
                    keys = {}  # one stream per runner: auto's pick is often the best speculative one
                    for n in PIPELINE_ROWS:
                        if picks[n][0] not in keys:
                            keys[picks[n][0]] = n
                    best = (frame, setup, {n: runners[k] for k, n in keys.items()})
                del setup, runners
                gc.collect()
            if best is not None:
                _, setup, chosen = best
                with phase("streams"):
                    stream_rows.extend(time_streams(setup, chosen, batches=(1,), text=text, frames=frames,
                                                    repeats=stream_repeats, seed=seed, progress=progress)["rows"])
                if concurrency is True or (concurrency and model in concurrency):
                    stepped = {"AR": setup.runner("ar", False)}
                    best_spec = next(r for r in rows if r["model"] == model and r["precision"] == setup.precision
                                     and r["row"] == "best speculative")
                    stepped["best speculative"] = setup.runner(best_spec["decoder"], False)
                    with phase("concurrency"):
                        conc_rows.extend(time_streams(setup, stepped, batches=batches, text=text, frames=frames,
                                                      repeats=1, seed=seed, progress=progress)["rows"])
                best = None
                gc.collect()

    _, bandwidth = bandwidth_around(measure)
    # the floor is the least time: the best read observed (wall clock or, with one thread, the thread's CPU time),
    # not a pass that other processes slowed
    bandwidth["floor_gb_per_s"] = max(bandwidth["gb_per_s_max"], bandwidth.get("gb_per_s_cpu") or 0.0)
    _finish(rows, bandwidth["floor_gb_per_s"])
    _attach_streams(rows, stream_rows)
    meta = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__, "bandwidth": bandwidth,
            "codec_peak_gflops": peaks, "context": CONTEXT, "chunk_frames": chunk_frames, "frames": frames,
            "batches": list(batches), "repeats": repeats, "stream_repeats": stream_repeats, "warmup": warmup,
            "noise_target": noise_target, "parts_runs": metas, "models": list(models), "precisions": precisions,
            "replay": acceptance.describe(), "replay_text": acceptance.text, "text": text, "seed": seed,
            "oversubscribed": [m for m in metas if m["note"]], "phase_s": dict(phase),
            "total_s": phase.total_s()}
    return {"rows": rows, "streams": stream_rows, "concurrency": conc_rows, "sustained": sustained(conc_rows),
            "quoted": [dict(q) for q in PUBLIC_PIPELINES], "meta": meta}


def _attach_streams(rows: list[dict], streams: Sequence[dict]) -> None:
    """The measured streams' ``stream_{ttfa_ms,frame_ms,rtf,underruns}_{1t,2c}`` beside the parts of the same row."""
    by = {(s["model"], s["precision"], s["decoder"], s["fused"], s["layout"]): s for s in streams}
    for r in rows:
        for layout, tag in zip(LAYOUTS, ("1t", "2c")):
            s = by.get((r["model"], r["precision"], r["decoder"], r["fused"], layout))
            for k in ("ttfa_ms", "frame_ms", "rtf", "underruns"):
                r[f"stream_{k}_{tag}"] = s[k] if s else None


def pipeline_rows(result: dict) -> list[dict]:
    """The rows to save and show: the measured rows, then the quoted ones (figures in ``quoted_rtf``,
    ``quoted_ttfa_ms``)."""
    rows = [{**r, "quoted_rtf": None, "quoted_ttfa_ms": None} for r in result["rows"]]
    return rows + [{"model": q["model"], "weights": "QUOTED, not measured here", "precision": q["precision"],
                    "row": f"{q['source']}, {q['device']}", "quoted_rtf": q["quoted_rtf"],
                    "quoted_ttfa_ms": q["quoted_ttfa_ms"]} for q in result["quoted"]]


def caption(result: dict) -> str:
    """One line of a :func:`bench_table` or :func:`pipeline_table` result: the CPU (the table: its flags), threads,
    frames per median, the floors' bandwidth (the pipeline: the codec's peaks), the replay's words, the columns,
    oversubscription."""
    m = result["meta"]
    over = m["oversubscribed"] and (f"; OVERSUBSCRIBED ({len(m['oversubscribed'])} "
                                    + ("runs" if "streams" not in result else
                                       f"timings: {'; '.join(x['note'] for x in m['oversubscribed'])}")
                                    + "), TIMES ARE PESSIMISTIC") or ""
    if "streams" in result:
        peaks = ", ".join(f"{k.replace('torch.', '')} {v:.0f} GFLOP/s" for k, v in m["codec_peak_gflops"].items())
        return (f"the whole frame on {m['cpu']} ({m['cpu_count']} CPUs), torch {m['torch']}: parts timed on one "
                f"thread, interleaved (ms per frame, wall clock; thread CPU time in *_cpu_ms); floors: talker and code "
                f"predictor bytes / {m['bandwidth']['floor_gb_per_s']:.1f} GB/s (the best read observed), codec "
                f"matmul FLOPs / the core's peak ({peaks or 'n/a'}); frame 1t = talker + inner + codec, frame 2c = "
                f"max(talker + inner, codec) (overlapped); RTF = ms per frame / 80; chunks of {m['chunk_frames']} "
                f"frame(s); random-weight rows: {m['replay_text']}; quoted rows: public ports' own figures, not "
                "measured here" + over)
    fl, bw = m["cpu_flags"], m["bandwidth"]
    return (f"inner-loop frame times on {m['cpu']} ({m['cpu_count']} CPUs; bf16 flags: "
            f"{', '.join(fl['bf16']) or 'none'}; int8 dot-product flags: {', '.join(fl['int8_dot']) or 'none'}), "
            f"{m['threads']} thread(s), torch {m['torch']}, median of {_frames_words(m)} frames per runner, "
            f"interleaved per (model, precision, backend); random-weight rows: {m['replay_text']}; RTF = ms per frame "
            f"/ 80 ms; x fused AR = ms per frame / the fused AR frame's (target for the fused speculative frame: <= "
            f"{m['fused_target']}); floor AR = 15 calls x the weight-streaming floor at {bw['gb_per_s']:.1f} GB/s (the "
            f"faster of {bw['gb_per_s_before']:.1f} before and {bw['gb_per_s_after']:.1f} after the timing)" + over)


def format_table(result: dict) -> str:
    """A :func:`bench_table` or :func:`pipeline_table` result as text (what ``rvqspec bench table`` and ``bench
    pipeline`` print): the caption, the rows (a timing replay's model marked), then the table's public ports, or the
    pipeline's streams, concurrency and quoted ports, each through :func:`bench.frames.format_rows`."""
    rows = [{**r, "model": r["model"] + (" (replay)" if r["weights"] != "trained" else "")} for r in result["rows"]]
    if "streams" not in result:
        rows = [{**r, "label": runner_label(r) if r["decoder"] else ""} for r in rows]
        return "\n".join([caption(result), format_rows(rows, (
            "model", "precision", "backend", "row", "label", "ms_per_frame", "rtf", "tokens_per_call", "speedup_vs_ar",
            "x_fused_ar", "floor_ar_ms", "x_floor_ar", "note")), f"(replay) = {result['meta']['replay_text']}",
            *(f"public ports: {f}" for f in result["footer"])])
    out = [caption(result), format_rows(rows, (
        "model", "precision", "row", "decoder", *(f"{p}_{k}" for p in PARTS for k in ("ms", "x_floor")),
        "frame_1t_ms", "rtf_1t", "frame_2c_ms", "rtf_2c", "inner_gain", "frame_gain_1t", "frame_gain_2c",
        "moves_frame"))]
    if result["streams"]:
        out += ["measured streams (first audio after the prompt):", format_rows(result["streams"], (
            "model", "precision", "row", "layout", "ttfa_ms", "rtf", "frame_ms", "underruns"))]
    if result["concurrency"]:
        out += ["concurrent streams (stepped through the native verify backend), and the most sustained in real time:",
                format_rows(result["concurrency"], ("model", "row", "layout", "batch", "frame_ms", "ttfa_ms",
                                                    "realtime")),
                format_rows(result["sustained"], ("model", "row", "layout", "streams", "batches"))]
    return "\n\n".join(out + ["quoted, not measured here:", format_rows(result["quoted"])])


def save(result: dict, path_stem, prov: dict) -> dict:
    """Write a :func:`bench_table` or :func:`pipeline_table` result: ``<stem>.csv`` + ``.md`` (the rows, captioned;
    the table's public ports in its caption, the pipeline's quoted rows after its own: :func:`pipeline_rows`), the
    pipeline's ``<stem>_streams`` and ``<stem>_concurrency``, and ``<stem>.json`` (everything, provenance). Returns
    the paths."""
    pipeline = "streams" in result
    cap = caption(result) + ("" if pipeline else " | " + " | ".join(result["footer"]))
    out = save_table(pipeline_rows(result) if pipeline else result["rows"], path_stem, prov, caption=cap)
    for part in ("streams", "concurrency") if pipeline else ():
        if result[part]:
            out[part] = save_table([{k: v for k, v in r.items() if k != "chunks"} for r in result[part]],
                                   f"{path_stem}_{part}", prov, caption=cap)
    out["json"] = save_json(result, f"{path_stem}.json", prov)
    return out
