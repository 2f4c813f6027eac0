"""One table a user can act on (``rvqspec bench --table``, ``make bench``, notebook 05; docs/precision.md#the-table).

Per model (the embedded model, trained; the real-size 0.6B architecture, random weights, its speculative frames a
timing replay with a trained model's acceptance: :mod:`rvqspec_lib.decoding.replay`), per precision (those the
running CPU runs natively, float32 always) and per backend (eager, compile; onnx on request), five rows
(:data:`ROWS`):

* ``stepped AR``: one verify-backend call per code (:class:`~rvqspec_lib.decoding.decoders.AR`);
* ``fused AR``: the whole AR frame as one call (:class:`~rvqspec_lib.models.fused.FusedARFrame` or its export);
* ``best speculative``: the fastest of the chain windows and calibrated trees timed through ``decode_frame``
  (which one is named);
* ``fused speculative``: the fastest fused speculative round timed, one graph a round (which one is named):
  :class:`~rvqspec_lib.models.fused_spec.FusedChainFrame` of each chain window (2..8) and
  :class:`~rvqspec_lib.models.fused_tree.FusedTreeFrame` of the point-mass calibrated tree of each budget
  (:func:`rvqspec_lib.eval.export_timing.fused_chain_frame`). Absent in a timing replay: a fused round computes its
  acceptance inside its graph, so no oracle can replace it;
* ``auto``: the decoder :func:`rvqspec_lib.eval.budget.choose_decoder` picks for this precision on the first
  backend (timed on the spot, not cached), timed again in the same run as the others.

The first backend (``eager`` by default: the fused rounds then run eagerly, nothing is compiled) times every chain,
calibrated tree and fused round asked for; a later backend (``compile``, ``onnx``: one compiled graph per call shape
or round) times AR, its fused AR frame, and the first backend's best speculative decoder, fastest fused round and
auto's choice, so that the compile time stays a few graphs per precision (a fused round's build seconds are in its
row's ``build_s``). Every row also has ``x_fused_ar``, its ms per frame over the fused AR frame's: the issue's target
for the fused speculative round is :data:`FUSED_TARGET` or below.

Each in ms per frame (median over ``repeats`` frames, all of a (model, precision, backend) interleaved:
:func:`rvqspec_lib.eval.speed.time_frames`) and as the inner loop's real-time factor, ms per frame over the 80 ms a
frame lasts (below 1: faster than real time; the talker's step is not in it). Beside them, per precision, the
weight-streaming floor of the AR frame (15 calls x the floor of one call, :mod:`rvqspec_lib.eval.floor`) and the
frame as a multiple of it; under the table the public ports' published figures, labelled and never in a measured
column (:data:`PUBLIC_PORTS`).

Precisions whose linear layers are int8 (:class:`~rvqspec_lib.models.precision.Int8Linear`) are timed eagerly and
natively only: eagerly their stepped calls through :class:`~rvqspec_lib.decoding.predictor.OfficialBackend`, their
fused AR frame and fused rounds eagerly (the lean stack applies an int8 layer through its own int8 forward); their
compiled backends are absent with the reason; so are onnx's bfloat16 and int8 rows (the exported graphs are float32).

The ``native`` backend (every precision): stepped calls through the C forward
(:class:`~rvqspec_lib.models.native.NativeCodePredictor`), its fused AR frame and fused speculative chains the whole
frame in one C call (:class:`~rvqspec_lib.models.native_frame.NativeChainFrame`, window 1 for AR); no fused trees.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Sequence

#: Backends the table knows (a subset of :data:`rvqspec_lib.eval.export_timing.BACKENDS`: the CPU ones that time
#: whole frames).
TABLE_BACKENDS = ("eager", "native", "compile", "onnx")
#: Default backends: eager and native. ``compile`` (and ``onnx``) on request: a compiled backend compiles one graph per
#: call shape (each decoder has two), minutes each on a small shared CPU; it then times only AR, the fused AR frame
#: and the decoders the first backend's rows found best and auto chose. ``native`` (the C forward,
#: :mod:`rvqspec_lib.models.native`, and the whole frame in C, :mod:`rvqspec_lib.models.native_frame`) builds in
#: seconds and times every decoder, like the first backend.
DEFAULT_BACKENDS = ("eager", "native")
#: Default models: the trained embedded model and the real-size 0.6B architecture (random weights, replayed).
DEFAULT_MODELS = ("embedded", "qwen3-tts-0.6b-random")
#: Chain windows and calibrated-tree node budgets timed for the "best speculative" row.
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
#: The issue's target for the fused speculative round: its frame at most this multiple of the fused AR frame's
#: (>= 1.5x faster), same model, precision and backend (issue 17).
FUSED_TARGET = 0.67
#: Why a timing replay has no fused speculative row.
REPLAY_NO_FUSED = "a timing replay cannot drive a fused round (acceptance is inside its graph)"


def check_table_args(models: Sequence[str], precisions: Sequence[str], backends: Sequence[str]) -> None:
    """Every check that needs no model: known backends and present ones (one line naming the fix, e.g. onnxruntime
    not importable), precisions the CPU runs natively, model names the loader knows.

    Raises:
        ValueError: one line naming the fix.
    """
    from rvqspec_lib.eval.export_timing import backend_status
    from rvqspec_lib.models.loader import model_facts
    from rvqspec_lib.models.precision import check_precision

    for b in backends:
        if b not in TABLE_BACKENDS:
            raise ValueError(f"--backends {b!r}: the table times {', '.join(TABLE_BACKENDS)} (cuda: "
                             "scripts/gpu_bench.py; coreml: notebook 05 on a Mac)")
        ok, why = backend_status(b)
        if not ok:
            raise ValueError(f"--backends {b} is not available here: {why}")
    for p in precisions:
        check_precision(p)
    if "float32" not in precisions:
        raise ValueError("the table always has float32 (the reference precision): add it to --dtype")
    for m in models:
        model_facts(m)


def _decoders(calibration: dict, chains: Sequence[int], budgets: Sequence[int]) -> dict:
    from rvqspec_lib.decoding.decoders import AR, Chain
    from rvqspec_lib.models.tree_files import tree_from_calibration

    out = {"AR": AR()}
    for w in chains:
        out[f"chain:{int(w)}"] = Chain(int(w))
    for n in budgets:
        kind = calibration["best_kind"][str(int(n))]
        out[f"calibrated-{kind}:{int(n)}"] = tree_from_calibration(calibration, kind, int(n))
    return out


def _fused_specs(calibration: dict, chains: Sequence[int], budgets: Sequence[int]) -> dict:
    """``{label: (window, point-mass tree or None)}``: the fused rounds of the table's chain windows (those of
    2..8, the fused chain's range) and of the point-mass calibrated tree of each budget."""
    from rvqspec_lib.models.tree_files import tree_from_calibration

    out = {f"fused chain:{int(w)}": (int(w), None) for w in chains if 2 <= int(w) <= 8}
    for n in budgets:
        out[f"fused calibrated-point-mass:{int(n)}"] = (4, tree_from_calibration(calibration, "point-mass", int(n)))
    return out


def _build_fused(name: str, cp, specs: dict, *, threads: int | None) -> tuple[list, dict, list]:
    """Build (and, compiled, compile every round graph of) each fused round of ``specs`` for backend ``name``.

    Returns:
        ``(frames, {time_frames row label: (table label, build seconds)}, [why a round could not be built])``.
    """
    from rvqspec_lib.eval import speed
    from rvqspec_lib.eval.export_timing import fused_chain_frame

    frames, labels, failed = [], {}, []
    for label, (window, tree) in specs.items():
        t0 = time.perf_counter()
        try:
            frame = fused_chain_frame(name, cp, window, threads=threads, tree=tree)
            frame.compile_all(1)
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
            failed.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        frames.append(frame)
        labels[getattr(frame, "decoder_label", f"{speed.FUSED_SPEC}{frame.window}")] = \
            (label, round(time.perf_counter() - t0, 1))
    return frames, labels, failed


def _backend(name: str, cp, precision: str, *, threads: int | None):
    """``(verify backend, fused frame or None, note)`` for a precision; ``(None, None, why)`` when absent."""
    from rvqspec_lib.decoding.predictor import OfficialBackend
    from rvqspec_lib.eval.export_timing import make_backend
    from rvqspec_lib.models.fused import FusedARFrame

    if name == "native":
        from rvqspec_lib.models.native import NativeCodePredictor
        from rvqspec_lib.models.native_frame import NativeChainFrame

        nat = NativeCodePredictor(cp)
        return nat, NativeChainFrame(cp, 1, backend=nat), ""
    if precision.startswith("int8"):
        if name != "eager":
            return None, None, "int8 layers are timed eagerly here (their stepped calls through the official module)"
        return OfficialBackend(cp), FusedARFrame(cp, compile=False), \
            "official module (int8 layers); the fused frames eager"
    if name == "onnx" and precision != "float32":
        return None, None, "the exported graphs are float32"
    vb, fz = make_backend(name, cp, threads=threads, fused=True)
    return vb, fz, ""


def bench_table(*, models: Sequence[str] = DEFAULT_MODELS, precisions: Sequence[str] | None = None,
                backends: Sequence[str] = DEFAULT_BACKENDS, repeats: int = 5, warmup: int = 1,
                chains: Sequence[int] = DEFAULT_CHAINS, budgets: Sequence[int] = DEFAULT_BUDGETS,
                auto: bool = True, auto_frames: int = 4, auto_budgets: Sequence[int] = DEFAULT_BUDGETS,
                acceptance=None, n_contexts: int = 8, seed: int = 0,
                threads: int | None = None, progress: bool = True, noise_target: float | None = None) -> dict:
    """Measure the table (module docstring).

    Args:
        models: model names (:func:`rvqspec_lib.models.loader.load_model`); a random-weight one is timed as a replay.
        precisions: default the CPU's native ones (:func:`rvqspec_lib.models.precision.native_precisions`).
        backends: some of :data:`TABLE_BACKENDS`. repeats: timed frames per decoder (median); warmup: untimed
            frames first (compiled backends compile there). chains, budgets: the speculative decoders timed
            (calibrated trees of the embedded model's heads calibration, of their better kind), and the fused
            rounds timed (a fused chain per window of 2..8, a fused point-mass calibrated tree per budget).
        auto: time auto's choice (``choose_decoder`` with ``auto_frames`` frames, one repeat, shortlist 3, over
            AR, the chain windows 2..8 and the calibrated trees of ``auto_budgets``; ``synth --decoder auto`` also
            considers larger trees: a compiled backend compiles one graph per candidate shape, which is most of
            the table's time).
        acceptance: an :class:`rvqspec_lib.eval.replay.AcceptanceTable` for the replays (default the embedded
            model's, :func:`rvqspec_lib.eval.replay.default_acceptance`).
        noise_target: None (exactly ``repeats`` frames per decoder), or each (model, precision, backend) run goes
            on until every decoder's median has a relative standard error <= it, or 4 x ``repeats``
            (:mod:`rvqspec_lib.eval.noise`; ``meta["noise"]`` holds each run's frames and achieved noise).
        n_contexts: contexts decoded in turn (the embedded model's evaluation split; random ones for random
            weights). seed: seeds of the contexts, the decoders' generators and the replay's oracle.

    Returns:
        ``{"rows", "footer", "meta"}``: a row per (model, precision, backend, row of :data:`ROWS`) with
        ``model``, ``weights`` (``trained`` or the replay's words), ``precision``, ``backend``, ``row``,
        ``decoder``, ``ms_per_frame``, ``rtf`` (ms per frame / 80), ``tokens_per_call``, ``speedup_vs_ar``,
        ``x_fused_ar`` (ms per frame / the fused AR row's), ``floor_ar_ms``, ``x_floor_ar`` (ms per frame /
        floor_ar_ms), ``build_s`` (the fused speculative round's build and compile seconds, else None), ``note``
        (why a row is absent, what auto chose); ``footer``: :data:`PUBLIC_PORTS`; ``meta``: CPU model and flags,
        threads, bandwidth, repeats, load, the replay's label and table, the fused rounds' build seconds
        (``fused_build_s``), :data:`FUSED_TARGET`, seconds taken.

    Raises:
        ValueError: as :func:`check_table_args`.
    """
    import torch

    from rvqspec_lib.common.provenance import cpu_model
    from rvqspec_lib.eval import speed
    from rvqspec_lib.eval.bench import oversubscribed_note
    from rvqspec_lib.eval.budget import choose_decoder
    from rvqspec_lib.eval.floor import call_weight_bytes, floor_ms, read_bandwidth
    from rvqspec_lib.eval.replay import default_acceptance
    from rvqspec_lib.models.loader import load_model
    from rvqspec_lib.models.precision import apply_precision, cpu_features, native_precisions
    from rvqspec_lib.models.tree_files import load_calibration, tree_file

    started = time.perf_counter()
    precisions = list(precisions or native_precisions())
    check_table_args(models, precisions, backends)
    from rvqspec_lib.eval.noise import repeat_cap

    repeat_cap(noise_target, repeats, None)  # bad settings fail before any model loads
    acceptance = acceptance or default_acceptance()
    calibration = load_calibration(tree_file("embedded", "heads"), n_codes=15, drafter="heads")
    bandwidth = read_bandwidth()  # measured again after the timing: the floor uses the faster (other load varies)
    rows, crowded, chosen, fused_build, noise_runs = [], [], {}, {}, []
    for model in models:
        lm = load_model(model, dtype="float32", seed=seed)
        base = lm.code_predictor.eval()
        replay = bool(lm.is_random)
        weights = acceptance.text if replay else "trained"
        if replay:
            contexts = speed.random_contexts(base, n_contexts, seed=seed)
        else:
            from rvqspec_lib.data.frame_sources import frames_from_shipped

            contexts = frames_from_shipped(lm, "evaluation", max_frames=n_contexts, seed=seed).context
        n = int(base.config.num_code_groups) - 1
        for prec in precisions:
            cp = apply_precision(copy.deepcopy(base), prec, require_native=False)
            floor_ar = n * call_weight_bytes(cp, n_queries=1)["bytes"]  # BYTES for now: ms once the bandwidth is known
            for bname in backends:
                head = {"model": model, "weights": weights, "precision": prec, "backend": bname}

                def absent(why, head=head, floor_ar=floor_ar):
                    return [{**head, "row": r, "decoder": None, "ms_per_frame": None, "rtf": None,
                             "tokens_per_call": None, "speedup_vs_ar": None, "x_fused_ar": None,
                             "floor_ar_ms": floor_ar, "x_floor_ar": None, "build_s": None,
                             "note": f"absent: {why}"} for r in ROWS]
                oracle = acceptance.oracle(seed) if replay else None
                decoders = _decoders(calibration, chains, budgets)
                specs = {} if replay else _fused_specs(calibration, chains, budgets)
                auto_note = ""
                # the first backend's best and auto: a later backend (compile, onnx) times only those; native all
                first = chosen.get((model, prec)) if bname != "native" else None
                if bname == "native":  # the native frame is a chain: no fused trees
                    specs = {k: v for k, v in specs.items() if v[1] is None}
                if first is not None:
                    decoders = {k: v for k, v in decoders.items() if k in ("AR", first["best"])}
                    specs = {k: v for k, v in specs.items() if k == first["fused_best"]}
                try:  # a backend that cannot build or run this precision is a row saying why, not a crash
                    vb, fz, why = _backend(bname, cp, prec, threads=threads)
                    if vb is None:
                        rows += absent(why)
                        continue
                    if auto and first is not None and first.get("auto") is not None:
                        decoders["auto"] = first["auto"]
                        auto_note = f"auto chose {first['auto_label']} (on {first['backend']})"
                    elif auto:
                        choice = choose_decoder(cp, calibration, contexts, backend=vb, frames=auto_frames,
                                                repeats=1, cost_repeats=3, shortlist=3, seed=seed,
                                                budgets=auto_budgets, acceptance=oracle, native_frames=False)
                        decoders["auto"] = choice.decoder
                        auto_note = f"auto chose {choice.label}"
                    frames, fused_labels, fused_failed = _build_fused(bname, cp, specs, threads=threads)
                    res = speed.time_frames(cp, contexts, decoders, {bname: vb},
                                            fused={bname: fz} if fz else None,
                                            fused_spec={bname: frames} if frames else None, repeats=repeats,
                                            warmup=warmup, seed=seed, random_weights=replay, progress=progress,
                                            acceptance=oracle, noise_target=noise_target)
                    noise_runs.append({"model": model, "precision": prec, "backend": bname,
                                       **{k: res["meta"][k] for k in ("repeats", "max_repeats", "rel_se_max")}})
                except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
                    rows += absent(f"failed here: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                    continue
                crowd = oversubscribed_note({**res["meta"], "cpu_count": res["meta"].get("cpu_count")
                                             or os.cpu_count()})
                if crowd:
                    crowded.append(f"{model} {prec} {bname}: {crowd}")
                by = {r["decoder"]: r for r in res["rows"]}
                not_spec = ("AR", "auto", speed.FUSED, *fused_labels)
                spec = [r for k, r in by.items() if k not in not_spec]
                best = min(spec, key=lambda r: r["ms_per_frame"]) if spec else None
                timed_fused = [by[k] for k in fused_labels if k in by]
                fastest = min(timed_fused, key=lambda r: r["ms_per_frame"]) if timed_fused else None
                fused_label, built_s = fused_labels[fastest["decoder"]] if fastest else (None, None)
                for k, (label, b_s) in fused_labels.items():
                    fused_build[f"{model} {prec} {bname} {label}"] = b_s
                if (model, prec) not in chosen:
                    chosen[(model, prec)] = {
                        "backend": bname, "best": best and best["decoder"], "fused_best": fused_label,
                        "auto": decoders.get("auto"), "auto_label": auto_note.replace("auto chose ", "")}
                ar = by["AR"]["ms_per_frame"]
                fused_ms = by[speed.FUSED]["ms_per_frame"] if speed.FUSED in by else None
                if replay:
                    fused_note = f"absent: {REPLAY_NO_FUSED}"
                elif fastest is None:
                    fused_note = "absent: " + ("; ".join(fused_failed) if fused_failed else
                                               f"no fused round ran on {first['backend']}" if first is not None
                                               else "no fused round asked for (chains 2..8 or budgets)")
                else:
                    fused_note = (f"fastest of {len(timed_fused)} fused rounds timed" if first is None
                                  else f"the {first['backend']} rows' fastest fused round") + \
                        f"; built in {built_s:.1f} s" + (f"; not built: {'; '.join(fused_failed)}" if fused_failed
                                                         else "")
                picks = {"stepped AR": (by.get("AR"), "ar", why),
                         "fused AR": (by.get(speed.FUSED), "fused AR frame",
                                      "" if fz else f"absent: {why or 'no fused frame'}"),
                         "best speculative": (best, best and best["decoder"],
                                              f"best of {len(spec)} timed" if first is None
                                              else f"the {first['backend']} rows' best"),
                         "fused speculative": (fastest, fused_label, fused_note),
                         "auto": (by.get("auto"), auto_note.replace("auto chose ", "") or None,
                                  auto_note or "absent: auto not timed")}
                for r_name, (r, label, note) in picks.items():
                    ms = r and r["ms_per_frame"]
                    rows.append({**head, "row": r_name, "decoder": label if r else None, "ms_per_frame": ms,
                                 "rtf": ms / FRAME_MS if ms else None,
                                 "tokens_per_call": r and r.get("tokens_per_call"),
                                 "speedup_vs_ar": ar / ms if ms else None,
                                 "x_fused_ar": ms / fused_ms if ms and fused_ms else None, "floor_ar_ms": floor_ar,
                                 "x_floor_ar": None,  # set with the floor in ms, after the timing
                                 "build_s": built_s if r_name == "fused speculative" and r else None, "note": note})
    after = read_bandwidth()
    bandwidth = {**max(bandwidth, after, key=lambda b: b["gb_per_s"]), "gb_per_s_before": bandwidth["gb_per_s"],
                 "gb_per_s_after": after["gb_per_s"]}
    for r in rows:  # the AR frame's floor: 15 calls' weight bytes at the faster of the two bandwidths
        r["floor_ar_ms"] = floor_ms(r["floor_ar_ms"], bandwidth["gb_per_s"])
        r["x_floor_ar"] = r["ms_per_frame"] / r["floor_ar_ms"] if r["ms_per_frame"] else None
    meta = {"cpu": cpu_model(), "cpu_flags": cpu_features(), "native_precisions": list(native_precisions()),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "bandwidth": bandwidth, "repeats": repeats, "noise_target": noise_target, "noise": noise_runs,
            "warmup": warmup, "n_contexts": n_contexts, "seed": seed,
            "chains": list(chains), "budgets": list(budgets), "auto": auto, "models": list(models),
            "precisions": precisions, "backends": list(backends), "replay": acceptance.describe(),
            "replay_text": acceptance.text, "oversubscribed": crowded, "fused_build_s": fused_build,
            "fused_target": FUSED_TARGET, "total_s": time.perf_counter() - started,
            "interleaved": "the decoders of each (model, precision, backend) in one interleaved run"}
    return {"rows": rows, "footer": list(PUBLIC_PORTS), "meta": meta}


def _f(v, digits: int = 1) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _frames_words(m: dict) -> str:
    """How many frames each decoder's median is of: the fixed count, or the range a noise target made."""
    runs, target = m.get("noise") or [], m.get("noise_target")
    if target is None or not runs:
        return str(m["repeats"])
    made = sorted(r["repeats"] for r in runs)
    worst = [r["rel_se_max"] for r in runs if r["rel_se_max"] is not None]
    span = f"{made[0]}" if made[0] == made[-1] else f"{made[0]}-{made[-1]}"
    return (f"{span} (noise target {100 * target:.1f} %, at most {runs[0]['max_repeats']}"
            + (f", median's relative standard error <= {100 * max(worst):.1f} %" if worst else "") + ")")


def caption(result: dict) -> str:
    """One line: the CPU, its flags, threads, repeats, the replay's words, oversubscription."""
    m = result["meta"]
    fl = m["cpu_flags"]
    over = f"; OVERSUBSCRIBED ({len(m['oversubscribed'])} runs), TIMES ARE PESSIMISTIC" if m["oversubscribed"] else ""
    return (f"inner-loop frame times on {m['cpu']} ({m['cpu_count']} CPUs; bf16 flags: {', '.join(fl['bf16']) or 'none'}"
            f"; int8 dot-product flags: {', '.join(fl['int8_dot']) or 'none'}), {m['threads']} thread(s), torch "
            f"{m['torch']}, median of {_frames_words(m)} frames per decoder, interleaved per (model, precision, backend); "
            f"random-weight rows: {m['replay_text']}; RTF = ms per frame / 80 ms; x fused AR = ms per frame / the "
            f"fused AR frame's (target for the fused speculative round: <= {m.get('fused_target', FUSED_TARGET)}); "
            f"floor AR = 15 calls x the weight-streaming floor at {m['bandwidth']['gb_per_s']:.1f} GB/s"
            + (f" (the faster of {m['bandwidth']['gb_per_s_before']:.1f} before and "
               f"{m['bandwidth']['gb_per_s_after']:.1f} after the timing)" if "gb_per_s_after" in m["bandwidth"] else "")
            + over)


def format_bench_table(result: dict) -> str:
    """The table as text (what ``rvqspec bench --table`` prints): caption, one line per row, the public ports."""
    cols = ("model", "precision", "backend", "row", "decoder", "ms/frame", "RTF", "tok/call", "vs AR",
            "x fused AR", "floor AR ms", "x floor", "note")
    lines = [caption(result), " | ".join(cols)]
    for r in result["rows"]:
        model = r["model"] + (" (replay)" if r["weights"] != "trained" else "")
        lines.append(" | ".join([model, r["precision"], r["backend"], r["row"], r["decoder"] or "",
                                 _f(r["ms_per_frame"]), _f(r["rtf"], 2), _f(r["tokens_per_call"], 2),
                                 _f(r["speedup_vs_ar"], 2), _f(r.get("x_fused_ar"), 2), _f(r["floor_ar_ms"]),
                                 _f(r["x_floor_ar"], 2),
                                 r["note"] or ""]))
    lines += [f"(replay) = {result['meta']['replay_text']}"] + [f"public ports: {f}" for f in result["footer"]]
    return "\n".join(lines)


def save_bench_table(result: dict, path_stem, prov: dict) -> dict:
    """Write the table as ``<stem>.csv`` + ``<stem>.md`` (:func:`rvqspec_lib.common.provenance.save_table`, the
    caption and the public ports in the Markdown's first line and the sidecar) and ``<stem>.json`` (rows, footer,
    meta, provenance). Returns the paths."""
    from pathlib import Path

    from rvqspec_lib.common.provenance import save_json, save_table

    cap = caption(result) + " | " + " | ".join(result["footer"])
    out = save_table(result["rows"], path_stem, prov, caption=cap)
    out["json"] = save_json(result, Path(str(path_stem) + ".json"), prov)
    return out
