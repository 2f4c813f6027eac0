"""One table a user can act on (``rvqspec bench table``, ``make bench``, notebook 07): per model (the real-size 0.6B
architecture has random weights, timing only: its speculative frames a timing replay), precision and backend the
five rows of :data:`ROWS` (stepped and fused AR, the fastest stepped and fused speculative frames, ``auto``'s pick),
each against the AR frame's weight-streaming floor; what each row and column means: docs/precision.md#the-table.
:func:`fastest_by_model` and :func:`round_costs` read what to run, and why, off the rows."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Sequence

import torch

from rvqspec_lib.common.machine import cpu_model
from rvqspec_lib.common.provenance import save_json, save_table
from rvqspec_lib.data.frame_sources import frames_from_shipped
from rvqspec_lib.decoding.decoder_names import check_decoder_names
from rvqspec_lib.eval import noise
from rvqspec_lib.eval.budget import choose_decoder
from bench.floor import call_weight_bytes, floor_ms
from rvqspec_lib.eval.replay import default_acceptance
from bench.frames import fastest, format_rows
from rvqspec_lib.eval.speed import random_contexts, time_frames
from rvqspec_lib.eval.timing import bandwidth_around, oversubscribed_note
from rvqspec_lib.models.backends import available, frame_runner, fused_support, runner_label, verify_backend
from rvqspec_lib.models import loader  # loader.load_model, looked up at call time (tests replace it)
from rvqspec_lib.models.named_decoders import drafter_calibration, resolve_all
from rvqspec_lib.device.precision import apply_precision, check_precision, cpu_features, native_precisions
from rvqspec_lib.models.tree_files import load_calibration, tree_file

#: Backends the table knows: the CPU ones of the registry that time whole frames.
TABLE_BACKENDS = ("eager", "native", "compile", "onnx")
#: Default backends.
DEFAULT_BACKENDS = ("eager", "native")
#: Backends that time every decoder (they build in seconds); the others time AR and the full backends' picks.
FULL_BACKENDS = ("eager", "native")
#: Default models: the trained embedded model and the real-size 0.6B architecture (random weights, replayed).
DEFAULT_MODELS = ("embedded", "qwen3-tts-0.6b-random")
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
ROWS = ("stepped AR", "fused AR", "best speculative", "fused speculative", "auto")
#: The decoder's fields of a row (:func:`rvqspec_lib.models.backends.runner_fields`, less backend and precision).
DECODER_FIELDS = ("decoder", "kind", "drafter", "nodes", "lossy", "fused")
#: The issue's target for the fused speculative frame: at most this multiple of the fused AR frame's (>= 1.5x
#: faster), same model, precision and backend (issue 17).
FUSED_TARGET = 0.67
#: Why a timing replay has no fused speculative row.
REPLAY_NO_FUSED = "a timing replay cannot drive a fused frame (its acceptance is inside it)"
#: What a backend that fails to build or run a precision becomes: a row saying why, not a crash.
_FAILURES = (RuntimeError, NotImplementedError, ValueError, TypeError)


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


def check_table_args(models: Sequence[str], precisions: Sequence[str], backends: Sequence[str], *,
                     chains: Sequence[int] = DEFAULT_CHAINS, budgets: Sequence[int] = DEFAULT_BUDGETS) -> None:
    """Every check that needs no model: known, present backends, each once; precisions the CPU runs natively, float32
    among them; the decoders' names; model names.

    Raises:
        ValueError: one line naming the fix.
    """
    for b in backends:
        if b not in TABLE_BACKENDS:
            raise ValueError(f"--backends {b!r}: the table times {', '.join(TABLE_BACKENDS)} (cuda: "
                             "rvqspec bench frames --device cuda; coreml: notebook 06 on a Mac)")
        ok, why = available(b)
        if not ok:
            raise ValueError(f"--backends {b} is not available here: {why}")
    if len(set(backends)) != len(backends):
        raise ValueError(f"--backends {','.join(backends)}: name each backend once")
    for p in precisions:
        check_precision(p)
    if "float32" not in precisions:
        raise ValueError("the table always has float32 (the reference precision): add it to --dtype")
    check_decoder_names(decoder_names(chains, budgets))
    for m in models:
        loader.model_facts(m)


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
    verify = verify_backend(bname, cp, threads=opts["threads"])
    stepped = [k for k in named if full or k in ("ar", picks["best"])]
    replayed = REPLAY_NO_FUSED if oracle is not None else None
    no_fused = {k: fused_support(bname, named[k].decoder) or (replayed if k != "ar" else None)
                for k in named if named[k].name.kind in ("ar", "chain")}
    fused = [k for k, why in no_fused.items() if why is None and (full or k in ("ar", picks["fused"]))]
    runners = [frame_runner(bname, cp, named[k], verify=verify, acceptance=oracle) for k in stepped] + \
        [frame_runner(bname, cp, named[k], fused=True, verify=verify, threads=opts["threads"]) for k in fused]
    auto_note, auto_key = "absent: auto not timed", None
    if auto:
        if full:
            choice = choose_decoder(cp, calibration, contexts, backends={bname: verify}, frames=opts["auto_frames"],
                                    repeats=1, cost_repeats=3, shortlist=3, seed=opts["seed"],
                                    budgets=opts["auto_budgets"], acceptance=oracle)
            pick, auto_note = (choice.named, choice.fused), f"auto chose {choice.label}{', fused' * choice.fused}"
        else:
            pick, auto_note = picks["auto"], f"{picks['auto_note']} (on {picks['backend']})"
        why = fused_support(bname, pick[0].decoder) if pick[1] else None
        if why:
            auto_note = f"absent: {auto_note}; {why}"
        else:
            auto_key = (pick[0].label, pick[1])
            if not any((r.name.label, r.fused) == auto_key for r in runners):
                runners.append(frame_runner(bname, cp, pick[0], fused=pick[1], verify=verify,
                                            acceptance=None if pick[1] else oracle, threads=opts["threads"]))
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


def bench_table(*, models: Sequence[str] = DEFAULT_MODELS, precisions: Sequence[str] | None = None,
                backends: Sequence[str] = DEFAULT_BACKENDS, repeats: int = 5, warmup: int = 1,
                chains: Sequence[int] = DEFAULT_CHAINS, budgets: Sequence[int] = DEFAULT_BUDGETS,
                auto: bool = True, auto_frames: int = 4, auto_budgets: Sequence[int] = DEFAULT_BUDGETS,
                acceptance=None, n_contexts: int = 8, seed: int = 0, threads: int | None = None,
                progress: bool = True, noise_target: float | None = None) -> dict:
    """Measure the table (docs/precision.md#the-table).

    Args:
        models: model names; a random-weight one is timed as a replay of ``acceptance`` (default
            :func:`rvqspec_lib.eval.replay.default_acceptance`).
        precisions: default the CPU's native ones. backends: some of :data:`TABLE_BACKENDS`, each once.
        repeats, warmup, noise_target: :func:`rvqspec_lib.eval.speed.time_frames`'s, per (model, precision, backend).
            chains, budgets: the speculative decoders. auto, auto_frames, auto_budgets: time auto's choice.
            n_contexts: contexts decoded in turn (the evaluation split; random ones for random weights). seed:
            contexts, generators, the replay's oracle. threads: onnx's.

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
    opts = {"threads": threads, "auto_frames": auto_frames, "auto_budgets": auto_budgets, "seed": seed,
            "repeats": repeats, "warmup": warmup, "progress": progress, "noise_target": noise_target}
    rows, crowded, build, noise_runs = [], [], {}, []

    def measure():
        for model in models:
            lm = loader.load_model(model, dtype="float32", seed=seed)
            base, replay = lm.code_predictor.eval(), bool(lm.is_random)
            contexts, cal, named = table_decoders(lm, chains, budgets, n_contexts=n_contexts, seed=seed)
            for prec in precisions:
                cp = apply_precision(copy.deepcopy(base), prec, require_native=False)
                floor_bytes = (int(base.config.num_code_groups) - 1) * call_weight_bytes(cp, n_queries=1)["bytes"]
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


def caption(result: dict) -> str:
    """One line: the CPU, its flags, threads, frames per median, the replay's words, the floor's bandwidth,
    oversubscription."""
    m = result["meta"]
    fl, bw = m["cpu_flags"], m["bandwidth"]
    over = f"; OVERSUBSCRIBED ({len(m['oversubscribed'])} runs), TIMES ARE PESSIMISTIC" if m["oversubscribed"] else ""
    return (f"inner-loop frame times on {m['cpu']} ({m['cpu_count']} CPUs; bf16 flags: "
            f"{', '.join(fl['bf16']) or 'none'}; int8 dot-product flags: {', '.join(fl['int8_dot']) or 'none'}), "
            f"{m['threads']} thread(s), torch {m['torch']}, median of {_frames_words(m)} frames per runner, "
            f"interleaved per (model, precision, backend); random-weight rows: {m['replay_text']}; RTF = ms per frame "
            f"/ 80 ms; x fused AR = ms per frame / the fused AR frame's (target for the fused speculative frame: <= "
            f"{m['fused_target']}); floor AR = 15 calls x the weight-streaming floor at {bw['gb_per_s']:.1f} GB/s (the "
            f"faster of "
            f"{bw['gb_per_s_before']:.1f} before and {bw['gb_per_s_after']:.1f} after the timing)" + over)


def format_bench_table(result: dict) -> str:
    """The table as text (what ``rvqspec bench table`` prints): caption, the rows, the public ports."""
    cols = ("model", "precision", "backend", "row", "label", "ms_per_frame", "rtf", "tokens_per_call", "speedup_vs_ar",
            "x_fused_ar", "floor_ar_ms", "x_floor_ar", "note")
    rows = [{**r, "model": r["model"] + (" (replay)" if r["weights"] != "trained" else ""),
             "label": runner_label(r) if r["decoder"] else ""} for r in result["rows"]]
    return "\n".join([caption(result), format_rows(rows, cols), f"(replay) = {result['meta']['replay_text']}",
                      *(f"public ports: {f}" for f in result["footer"])])


def save_bench_table(result: dict, path_stem, prov: dict) -> dict:
    """Write ``<stem>.csv`` + ``<stem>.md`` (with the caption and the public ports) and ``<stem>.json``. Returns the
    paths."""
    out = save_table(result["rows"], path_stem, prov, caption=caption(result) + " | " + " | ".join(result["footer"]))
    out["json"] = save_json(result, Path(str(path_stem) + ".json"), prov)
    return out


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
