"""Export and timing across backends (notebook 05; the paper's device figure, speedup vs node budget N).

One harness over the backends present, each reported as absent (with the reason) when it is not:

* ``eager``: the lean forward in PyTorch (:class:`~rvqspec_lib.models.lean.LeanCodePredictor`, bit-identical to the
  official call) and the eager fused AR frame;
* ``compile``: the same under ``torch.compile`` (one graph per call shape; the fused frame compiled whole);
* ``onnx``: ONNX Runtime on the CPU: verify calls through an exported hidden-state verify graph
  (:class:`~rvqspec_lib.models.export_formats.ExportedBackend`) and the exported frame graph;
* ``coreml``: Core ML packages, macOS 15+ only (:func:`coreml_call_times` times them per compute unit);
* ``cuda``: CUDA graphs on a GPU (:mod:`rvqspec_lib.models.cuda_graphs`; ``scripts/gpu_bench.py``).

What is measured (docs/style.md#benchmarks, docs/methods.md#reporting-speed): frame times of AR, the fused AR frame and
every speculative decoder per backend, interleaved (:func:`frame_times`, over
:func:`rvqspec_lib.eval.speed.time_frames`), the speedup of each over AR of the SAME backend as a function of the node
budget N (:func:`speedup_vs_n`), the verify cost curve per backend and the speedup it projects,
``E(N) t(1) / t(N)`` (:func:`projected_speedup`, docs/methods.md#choosing-the-node-budget), and the numerical
agreement of every exported graph with eager PyTorch (:func:`numerical_agreement`).
"""

from __future__ import annotations

import importlib.util
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from rvqspec_lib.common.progress import progress_bar
from rvqspec_lib.common.provenance import cpu_model
from rvqspec_lib.eval import noise, speed
from rvqspec_lib.models import export_formats as F
from rvqspec_lib.models import export_graphs as G
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decoders import AR, Chain, Tree

#: Backends of the harness, in the order tables list them.
BACKENDS = ("eager", "compile", "onnx", "coreml", "cuda", "native")
#: The paper's reported speedups of RVQ token generation on devices (Core ML), by node budget N. Quoted, not measured
#: here: tables put them in their own labelled column.
PAPER_DEVICE_SPEEDUPS = (
    {"device": "M3 Pro (paper, Core ML)", "nodes": 32, "speedup": 2.13},
    {"device": "iPhone 17 Pro Max (paper, Core ML)", "nodes": 32, "speedup": 2.34},
    {"device": "iPhone 12 (paper, Core ML)", "nodes": 16, "speedup": 1.82},
    {"device": "iPhone 12 (paper, Core ML)", "nodes": 64, "speedup": 1.21},
)
#: Largest max abs logit difference an exported graph may show against eager PyTorch (the official module in
#: float32), relative to the largest reference logit: float32 graphs differ by summation order only (~1e-7);
#: float16 graphs by float16 rounding of weights and activations (2^-11 relative per operation, over 2-5 layers).
#: A Core ML package keeps its KV cache in float16 states whatever its precision, so both its precisions get the
#: float16 tolerance.
RELATIVE_TOLERANCE = {"float32": 1e-5, "float16": 2e-2}


def tolerance(fmt: str, dtype: str) -> float:
    """The :data:`RELATIVE_TOLERANCE` of a (format, dtype): Core ML packages, float16 states, get float16's."""
    return RELATIVE_TOLERANCE["float16" if fmt == "coreml" else dtype]


# ----------------------------------------------------------------------------------------------------------------
# Which backends are here
# ----------------------------------------------------------------------------------------------------------------
def backend_status(name: str) -> tuple[bool, str]:
    """``(available, reason)`` for a backend of :data:`BACKENDS` on this machine (reason empty when available).

    Raises:
        ValueError: an unknown backend name.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")
    if name == "eager":
        return True, ""
    if name == "compile":
        if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")) and not torch.cuda.is_available():
            return False, "torch.compile on the CPU needs a C/C++ compiler (none on PATH)"
        return True, ""
    if name == "onnx":
        missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
        return (not missing, f"missing Python packages: {', '.join(missing)} (pip install -r requirements.txt)"
                if missing else "")
    if name == "native":
        from rvqspec_lib.models.kernels import cpforward

        return (True, "") if cpforward.available() else \
            (False, f"the native forward cannot be built here ({cpforward.unavailable_reason()}): it needs an x86-64 "
                    "CPU and a C compiler (e.g. apt-get install gcc); use --backend eager meanwhile")
    if name == "coreml":
        if importlib.util.find_spec("coremltools") is None:
            return False, "coremltools is not installed"
        return F.coreml_available()
    if torch.cuda.is_available():
        return True, ""
    return False, "no CUDA device (torch.cuda.is_available() is False): run scripts/gpu_bench.py on a GPU machine"


def backend_table(names: Sequence[str] = BACKENDS) -> list[dict]:
    """A row per backend: ``backend``, ``available``, ``reason`` (why it is absent), ``device``."""
    rows = []
    for n in names:
        ok, why = backend_status(n)
        dev = {"cuda": torch.cuda.get_device_name(0) if n == "cuda" and ok else "GPU",
               "coreml": f"macOS {platform.mac_ver()[0]}" if n == "coreml" and ok else "Apple device"}.get(
            n, cpu_model())
        rows.append({"backend": n, "available": ok, "reason": why, "device": dev})
    return rows


def make_backend(name: str, code_predictor, *, work_dir=None, threads: int | None = None, sampling=None,
                 fused: bool = True) -> tuple[object, object | None]:
    """``(verify backend, fused frame)`` of a backend: what :func:`frame_times` times.

    Args:
        name: one of :data:`BACKENDS` (``native``: the C forward and the whole AR frame in C,
            :mod:`rvqspec_lib.models.native` and :mod:`rvqspec_lib.models.native_frame`; ``coreml``: macOS only; its frame-level decode is not implemented, use
            :func:`coreml_call_times`). code_predictor: the official module (on the GPU for ``cuda``).
        work_dir: where ONNX files go (a temporary folder by default). threads: ONNX Runtime threads.
        sampling: the fused frame's warpers. fused: build the fused frame (compiling or exporting it takes time).

    Raises:
        ValueError: an unknown or absent backend (the reason in the message).
    """
    ok, why = backend_status(name)
    if not ok:
        raise ValueError(f"backend {name} is not available here: {why}")
    from rvqspec_lib.models.fused import FusedARFrame
    from rvqspec_lib.models.lean import LeanCodePredictor

    if name == "eager":
        return LeanCodePredictor(code_predictor), FusedARFrame(code_predictor, sampling, compile=False) \
            if fused else None
    if name == "compile":
        return LeanCodePredictor(code_predictor, compile=True), FusedARFrame(code_predictor, sampling, compile=True) \
            if fused else None
    if name == "onnx":
        return (F.ExportedBackend(code_predictor, threads=threads, work_dir=work_dir),
                F.ExportedFrame(code_predictor, threads=threads, work_dir=work_dir, sampling=sampling)
                if fused else None)
    if name == "native":
        from rvqspec_lib.models.native import NativeCodePredictor
        from rvqspec_lib.models.native_frame import NativeChainFrame

        nat = NativeCodePredictor(code_predictor)
        return nat, NativeChainFrame(code_predictor, 1, sampling, backend=nat) if fused else None
    if name == "cuda":
        from rvqspec_lib.models.cuda_graphs import GraphedBackend, GraphedFrame

        return GraphedBackend(code_predictor), GraphedFrame(code_predictor, sampling) if fused else None
    raise ValueError("the Core ML backend times exported packages call by call (coreml_call_times), not through "
                     "decode_frame")


def fused_chain_frame(name: str, code_predictor, window: int = 4, *, sampling=None, work_dir=None,
                      threads: int | None = None, tree=None):
    """The fused speculative chain (one graph a round, uniforms drawn up front) of a backend, with
    :class:`~rvqspec_lib.models.fused_spec.FusedChainFrame`'s interface (``uniforms``, ``__call__``, ``decode``,
    ``last_calls``, ``compile_all``): what :func:`frame_times` times as the row ``fused-chain{window}``.

    Args:
        name: ``eager`` (the round functions run eagerly), ``compile`` (``torch.compile``, one graph per start
            depth) or ``onnx`` (one ONNX Runtime graph per start depth,
            :class:`~rvqspec_lib.models.fused_spec_export.OrtFusedChainFrame`; float32 only). code_predictor: the
            official module (any precision of :mod:`rvqspec_lib.models.precision` for eager and compile).
        window: the Chain window. sampling: the warpers. work_dir, threads: where ONNX files go, ONNX Runtime
            threads (onnx only). tree: a point-mass tree (``Tree(paths)``, e.g. a calibrated one): the fused tree
            round instead (:class:`~rvqspec_lib.models.fused_tree.FusedTreeFrame`, row ``fused-tree{N}``).

    Raises:
        ValueError: another backend name; what the frame classes refuse (a window outside 2..8, ``top_p < 1``, a
            module not in float32 for onnx).
    """
    from rvqspec_lib.models.fused_spec import FusedChainFrame

    if name in ("eager", "compile"):
        if tree is not None:
            from rvqspec_lib.models.fused_tree import FusedTreeFrame

            return FusedTreeFrame(code_predictor, tree, sampling, compile=name == "compile")
        return FusedChainFrame(code_predictor, int(window), sampling, compile=name == "compile")
    if name == "onnx":
        from rvqspec_lib.models.fused_spec_export import OrtFusedChainFrame

        return OrtFusedChainFrame(code_predictor, int(window), sampling, threads=threads, work_dir=work_dir,
                                  tree=tree)
    if name == "native":
        if tree is not None:
            raise ValueError("the native frame is a chain (native fused trees are not built): use eager or compile "
                             "for a fused tree round")
        from rvqspec_lib.models.native_frame import NativeChainFrame

        return NativeChainFrame(code_predictor, int(window), sampling)
    raise ValueError(f"the fused chain runs through eager, compile, onnx or native, not {name!r}")


# ----------------------------------------------------------------------------------------------------------------
# Decoders by node budget
# ----------------------------------------------------------------------------------------------------------------
def node_budget(decoder) -> int:
    """Query positions N of one verify call of a decoder: 1 for AR, the window for a chain, nodes + 1 for a tree."""
    if isinstance(decoder, AR):
        return 1
    if isinstance(decoder, Chain):
        return decoder.window
    if isinstance(decoder, Tree):
        return decoder.tree(15).n_nodes + 1
    raise ValueError(f"not a decoder: {decoder!r}")


def decoders_by_budget(calibration: dict | None, budgets: Sequence[int], *, chains: Sequence[int] = ()) -> dict:
    """``{label: decoder}``: AR, ``Chain(w)`` for each w in ``chains`` and, for each N in ``budgets``, the
    calibrated tree of node budget N (its better kind; :func:`rvqspec_lib.models.tree_files.tree_from_calibration`)
    or, without a calibration, a chain of N - 1 drafts when N <= 8."""
    from rvqspec_lib.models.tree_files import tree_from_calibration

    out = {"AR": AR()}
    for w in chains:
        out[f"chain{w}"] = Chain(int(w))
    for n in budgets:
        if calibration is not None:
            out[f"tree{n}"] = tree_from_calibration(calibration, None, int(n))
        elif 2 <= n <= 8 and f"chain{n}" not in out:
            out[f"chain{n}"] = Chain(int(n))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Numbers: agreement of exported graphs with eager PyTorch
# ----------------------------------------------------------------------------------------------------------------
def _compare(got: dict, ref: dict) -> dict:
    out = {}
    for k, r in ref.items():
        g = got[k]
        if r.dtype in (torch.int32, torch.int64):
            out[k] = {"codes_equal_frac": float((g.long() == r.long()).double().mean())}
        else:
            out[k] = {"max_abs_diff": float((g.double() - r.double()).abs().max()),
                      "max_abs_ref": float(r.double().abs().max())}
    return out


def numerical_agreement(code_predictor, *, graphs: Sequence[str] = G.GRAPHS, dtypes: Sequence[str] = ("float32",
                        "float16"), formats: Sequence[str] = ("onnx", "coreml"), nodes: int = 4, tree=None,
                        frame_code_predictor=None, work_dir=None, seeds: Sequence[int] = (0, 1),
                        compute_units: Sequence[str] = F.COREML_COMPUTE_UNITS, keep_files: bool = False) -> dict:
    """Export every (graph, format, dtype), run it where it can run, and compare with eager PyTorch.

    The reference is the OFFICIAL module in its own dtype (float32): :func:`rvqspec_lib.models.export_graphs.
    reference_outputs`, on the graph's example inputs for each seed. ONNX files run with ONNX Runtime here; Core ML
    packages run on macOS 15+ (per compute unit) and are otherwise built and checked for their declared inputs,
    outputs and states only (``ran`` False, the reason in ``note``).

    Args:
        code_predictor: the official module (float32). graphs, dtypes, formats: what to export. nodes, tree: the
            verify graph's node budget and tree. frame_code_predictor: a smaller module for the frame graph (its
            export unrolls every code; tests pass a 4-codebook model), default ``code_predictor``.
        work_dir: where files go (a temporary folder, removed, by default). seeds: example inputs compared.
        keep_files: keep the files (their paths are in the rows).

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per (graph, format, dtype, runner): ``graph``, ``format``,
        ``dtype``, ``runner`` (``onnxruntime-cpu``, ``coreml-<unit>``, ``not run``), ``ran``, ``interface_ok``
        (declared == written), ``bytes``, ``export_s``, ``max_abs_logit_diff`` (over every logit output and seed),
        ``max_abs_logit``, ``relative_diff``, ``tolerance`` (:data:`RELATIVE_TOLERANCE`), ``within_tolerance``,
        ``codes_equal_frac`` (frame graph: share of codes equal to eager), ``max_abs_cache_diff``, ``note``.
    """
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="rvqspec-export-")
        work_dir = tmp.name
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for graph in graphs:
            cp = frame_code_predictor if graph == "frame" and frame_code_predictor is not None else code_predictor
            n, tr = (nodes, tree) if graph == "verify" else (None, None)
            for fmt in formats:
                for dt in dtypes:
                    path = work / f"{graph}-{dt}{F.FORMATS[fmt]}"
                    res = F.export_graph(cp, graph, fmt, path, dtype=dt, nodes=n, tree=tr)
                    base = {"graph": graph, "format": fmt, "dtype": dt, "nodes": res["nodes"],
                            "interface_ok": res["declared"] == res["written"], "bytes": res["bytes"],
                            "export_s": round(res["export_s"], 1), "path": str(path) if keep_files else None}
                    rows += [{**base, **r} for r in check_file(cp, graph, path, dtype=dt, nodes=n, tree=tr,
                                                                 seeds=seeds, compute_units=compute_units)]
    finally:
        if tmp is not None and not keep_files:
            tmp.cleanup()
    meta = {**speed.run_meta(code_predictor), "seeds": list(seeds), "tolerance": RELATIVE_TOLERANCE,
            "reference": "official module, float32, eager"}
    return {"rows": rows, "meta": meta}


def check_file(code_predictor, graph: str, path, *, dtype: str = "float32", nodes: int | None = None, tree=None,
               seeds: Sequence[int] = (0, 1), compute_units: Sequence[str] = F.COREML_COMPUTE_UNITS) -> list[dict]:
    """Run an exported file where it can run and compare it with eager PyTorch (the official module, float32, on
    the graph's example inputs of each seed): a row per runner (``onnxruntime-cpu``, ``coreml-<unit>`` on macOS
    15+), or one ``not run`` row with the reason. Row fields as :func:`numerical_agreement`'s."""
    fmt = "onnx" if Path(path).suffix == ".onnx" else "coreml"
    ref_graph = G.build_graph(code_predictor, graph, nodes=nodes, tree=tree)
    refs = []
    for s in seeds:
        inp = G.example_inputs(ref_graph, seed=s)
        refs.append((inp, G.reference_outputs(ref_graph, inp)))
    if fmt == "onnx":
        runners = [("onnxruntime-cpu", lambda: F.OrtGraph(path))]
    elif F.coreml_available()[0]:
        runners = [(f"coreml-{u}", lambda u=u: F.CoreMLGraph(path, compute_unit=u)) for u in compute_units]
    else:
        return [{"runner": "not run", "ran": False, "note": F.coreml_available()[1]}]
    rows = []
    for runner_name, make in runners:
        runner = make()
        cmp = []
        for inp, ref in refs:
            if fmt == "coreml":
                runner.reset_state()
                _write_state(runner, inp)
            feed = {k: _cast_input(v, k, dtype, fmt) for k, v in inp.items()}
            cmp.append(_compare(runner(feed), {k: v for k, v in ref.items() if k in _outputs_of(runner, ref)}))
        rows.append({"runner": runner_name, "ran": True, **_summarise(cmp, dtype, tolerance(fmt, dtype)),
                     "note": ""})
    return rows


def _outputs_of(runner, ref: dict) -> set:
    names = getattr(runner, "output_names", None)
    return set(ref) if names is None else set(names) & set(ref)


def _cast_input(v: torch.Tensor, name: str, dtype: str, fmt: str):
    if fmt == "onnx" and v.is_floating_point() and name != "noise":
        return v.to(F.DTYPES[dtype])
    return v


def _write_state(runner, inp: dict) -> None:
    """Core ML: the example's cache goes into the package's state before the call (states start at zero)."""
    if "k_cache" in inp and hasattr(runner.state, "write_state"):
        import numpy as np

        for name in ("k_cache", "v_cache"):
            runner.state.write_state(name, inp[name].numpy().astype(np.float16))


def _summarise(cmp: list[dict], dtype: str, tol: float) -> dict:
    logit_keys = [k for k in cmp[0] if "logits" in k or k == "hidden"]
    cache_keys = [k for k in cmp[0] if "cache" in k]
    out: dict = {}
    if logit_keys:
        diff = max(c[k]["max_abs_diff"] for c in cmp for k in logit_keys)
        scale = max(c[k]["max_abs_ref"] for c in cmp for k in logit_keys)
        rel = diff / scale if scale else float("inf")
        out.update({"max_abs_logit_diff": diff, "max_abs_logit": scale, "relative_diff": rel,
                    "tolerance": tol, "within_tolerance": rel <= tol})
    if cache_keys:
        out["max_abs_cache_diff"] = max(c[k]["max_abs_diff"] for c in cmp for k in cache_keys)
    if "codes" in cmp[0]:
        out["codes_equal_frac"] = statistics.fmean(c["codes"]["codes_equal_frac"] for c in cmp)
        out["within_tolerance"] = out["codes_equal_frac"] == 1.0 if dtype == "float32" else None
    return out


# ----------------------------------------------------------------------------------------------------------------
# Frame times per backend, and speedup vs N
# ----------------------------------------------------------------------------------------------------------------
def frame_times(code_predictor, contexts: torch.Tensor, decoders: Mapping[str, object],
                backends: Sequence[str] = ("eager", "onnx"), *, fused: bool = True, repeats: int = 20,
                warmup: int = 2, seed: int = 0, sampling=None, work_dir=None, threads: int | None = None,
                random_weights: bool | None = None, progress: bool = True, built: Mapping | None = None,
                fused_chains: Sequence[int] = (), acceptance=None, noise_target: float | None = None,
                max_repeats: int | None = None) -> dict:
    """Frame times of every decoder through every AVAILABLE backend in one interleaved run
    (:func:`rvqspec_lib.eval.speed.time_frames`), the fused AR frame of each beside them.

    ``fused_chains``: windows of the fused speculative chain (:func:`fused_chain_frame`, one graph a round) timed
    through the ``eager``, ``compile`` and ``onnx`` backends beside them (rows ``fused-chain{N}``; every round graph is
    built before timing, its seconds in ``build_s["<backend>/fused-chain<N>"]``).

    ``acceptance``: a TIMING REPLAY's oracle (:class:`~rvqspec_lib.decoding.replay.AcceptanceOracle`) for every
    decoder's frames; the fused speculative chains compute their own acceptance inside their graphs, so they are
    refused with it (ValueError), and the CPU backends only.

    Args:
        decoders: ``{label: decoder}`` (include ``AR()``: speedups are over AR of the same backend).
        backends: backend names; absent ones are reported in ``absent``, never timed.
        fused: time each backend's fused AR frame too. built: ``{name: (backend, fused frame)}`` already made by
            :func:`make_backend` (their export or compile time is not spent again).
        noise_target, max_repeats: the CPU run's stopping rule (:func:`rvqspec_lib.eval.speed.time_frames`; the
            ``cuda`` run keeps a fixed ``repeats``). Others as :func:`rvqspec_lib.eval.speed.time_frames`.

    Returns:
        ``{"rows", "meta", "absent": {name: reason}, "build_s": {name: seconds}, "built": {name: (backend, fused
        frame)}}``; rows as ``time_frames``'s plus ``nodes`` (N of the decoder, None for the fused frame).
    """
    if acceptance is not None and (fused_chains or "cuda" in backends):
        raise ValueError("a timing replay replaces the accept step of decode_frame: drop fused_chains and cuda")
    noise.repeat_cap(noise_target, repeats, max_repeats)  # bad settings fail before any export
    absent, be, fz, build_s = {}, {}, {}, {}
    for name in backends:
        ok, why = backend_status(name)
        if not ok or name == "coreml":
            absent[name] = why or "Core ML is timed call by call (coreml_call_times), not through decode_frame"
            continue
        t0 = time.perf_counter()
        pair = (built or {}).get(name) or make_backend(name, code_predictor, work_dir=work_dir, threads=threads,
                                                       sampling=sampling, fused=fused)
        build_s[name] = round(time.perf_counter() - t0, 1)
        be[name] = pair[0]
        if fused and pair[1] is not None:
            fz[name] = pair[1]
    chains = {}
    for name in (n for n in be if n in ("eager", "compile", "onnx", "native")):
        for w in fused_chains:
            t0 = time.perf_counter()
            frame = fused_chain_frame(name, code_predictor, int(w), sampling=sampling, work_dir=work_dir,
                                      threads=threads)
            frame.compile_all(1)
            chains.setdefault(name, []).append(frame)
            build_s[f"{name}/fused-chain{int(w)}"] = round(time.perf_counter() - t0, 1)
    cpu = {k: v for k, v in be.items() if k != "cuda"}
    res = speed.time_frames(code_predictor, contexts, decoders, cpu, fused={k: v for k, v in fz.items()
                                                                            if k != "cuda"} or None,
                            fused_spec=chains or None,
                            sampling=sampling, repeats=repeats, warmup=warmup, seed=seed,
                            random_weights=random_weights, progress=progress, acceptance=acceptance,
                            noise_target=noise_target, max_repeats=max_repeats) if cpu else {"rows": [], "meta": {}}
    if "cuda" in be:  # another device: its own interleaved run, the GPU synchronised before each clock read
        dev = device_frame_times(code_predictor, contexts, decoders, be["cuda"], fz.get("cuda"), label="cuda",
                                 sampling=sampling, repeats=repeats, warmup=warmup, seed=seed, progress=progress)
        res["rows"] += dev["rows"]
        res.setdefault("meta", {})["cuda"] = dev["meta"]
    n_of = {label: node_budget(d) for label, d in decoders.items()}
    for r in res["rows"]:
        r["nodes"] = n_of.get(r["decoder"], r.get("nodes"))
    res["absent"], res["build_s"] = absent, build_s
    res["built"] = {name: (be[name], fz.get(name)) for name in be}  # reusable by verify_costs (built=)
    return res


def device_frame_times(code_predictor, contexts: torch.Tensor, decoders: Mapping[str, object], backend,
                       fused=None, *, fused_spec: Sequence = (), label: str = "cuda", sampling=None,
                       repeats: int = 20, warmup: int = 2, seed: int = 0, progress: bool = True) -> dict:
    """Frame times of every decoder through ONE backend on the contexts' device (a GPU: generators on the device,
    the device synchronised around each frame; :func:`time_conditions`), of its fused AR frame and of its fused
    speculative frames.

    Args:
        fused: the fused AR frame (``noise``, ``__call__``; e.g.
            :class:`~rvqspec_lib.models.cuda_graphs.GraphedFrame`), row :data:`rvqspec_lib.eval.speed.FUSED`.
        fused_spec: fused speculative chains (``uniforms``, ``__call__``, ``last_calls``, ``window``; e.g.
            :class:`~rvqspec_lib.models.cuda_graphs.GraphedChainFrame`), rows ``fused-chain<window>``; their
            uniforms are drawn inside the timed frame; capture them first (``compile_all``) or the first warm-up
            frame does.

    Returns:
        ``{"rows", "meta"}``, rows with ``decoder``, ``backend`` (= ``label``), ``tokens_per_call`` (a fused
        speculative frame: codes over calls, prefill included), ``calls_per_frame``, ``ms_per_frame``, ``p10_ms``,
        ``p90_ms``, ``speedup_vs_ar``, ``speedup_vs_fused``.
    """
    from rvqspec_lib.decoding.decode import decode_frame

    conditions = {}
    for dname, dec in decoders.items():
        def run(ctx, gen, dec=dec):
            res = decode_frame(code_predictor, ctx, decoder=dec, sampling=sampling, generator=gen, backend=backend)
            return float(res.tokens_per_call.mean())
        conditions[dname] = run
    if fused is not None:
        conditions[speed.FUSED] = lambda ctx, gen: (fused(ctx, fused.noise(ctx.shape[0], gen)), None)[1]
    for frame in fused_spec:
        def run_spec(ctx, gen, frame=frame):
            frame(ctx, frame.uniforms(ctx.shape[0], gen))
            return frame.n_codes / statistics.fmean(frame.last_calls)
        conditions[getattr(frame, "decoder_label", f"{speed.FUSED_SPEC}{frame.window}")] = run_spec
    t = time_conditions(conditions, contexts, repeats=repeats, warmup=warmup, seed=seed, progress=progress)
    ar = next((t[d]["median_ms"] for d, dec in decoders.items() if isinstance(dec, AR)), None)
    fz = t.get(speed.FUSED, {}).get("median_ms")
    rows = []
    for k, v in t.items():
        tpc = v["tokens_per_call"]
        rows.append({"decoder": k, "backend": label, "tokens_per_call": tpc,
                     "calls_per_frame": 1.0 if k == speed.FUSED else (P.n_codes(code_predictor) / tpc if tpc else None),
                     "ms_per_frame": v["median_ms"], "p10_ms": v["p10_ms"], "p90_ms": v["p90_ms"],
                     "speedup_vs_ar": ar / v["median_ms"] if ar else None,
                     "speedup_vs_fused": fz / v["median_ms"] if fz else None})
    meta = {**speed.run_meta(code_predictor), "repeats": repeats, "warmup": warmup, "seed": seed,
            "backend": getattr(backend, "name", label),
            "capture_s": {str(k): round(v, 2) for k, v in getattr(backend, "capture_s", {}).items()}}
    return {"rows": rows, "meta": meta}


def fused_spec_vs_fused_ar(rows: Sequence[dict]) -> list[dict]:
    """The fused speculative rounds beside the fused AR frame, per backend, from frame-time rows
    (:func:`device_frame_times`, :func:`rvqspec_lib.eval.speed.time_frames`).

    Returns:
        one row per ``fused-chain<N>`` / ``fused-tree<N>`` row: ``backend``, ``decoder``, ``ms_per_frame``,
        ``p10_ms``, ``p90_ms``, ``tokens_per_call``, ``calls_per_frame``, ``fused_ar_ms`` (the fused AR frame of
        the same backend, ``None`` without one) and ``x_fused_ar`` (ms per frame / ``fused_ar_ms``: below 1 the
        speculative frame is the faster), in the rows' order.
    """
    fused = {r["backend"]: r["ms_per_frame"] for r in rows if r["decoder"] == speed.FUSED}
    out = []
    for r in rows:
        if not str(r["decoder"]).startswith((speed.FUSED_SPEC, "fused-tree")):  # fused_tree.FusedTreeFrame's label
            continue
        ar = fused.get(r["backend"])
        out.append({"backend": r["backend"], "decoder": r["decoder"], "ms_per_frame": r["ms_per_frame"],
                    "p10_ms": r["p10_ms"], "p90_ms": r["p90_ms"], "tokens_per_call": r["tokens_per_call"],
                    "calls_per_frame": r["calls_per_frame"], "fused_ar_ms": ar,
                    "x_fused_ar": r["ms_per_frame"] / ar if ar else None})
    return out


def speedup_vs_n(rows: Sequence[dict]) -> list[dict]:
    """Figure 4's analogue from :func:`frame_times` rows: per backend and node budget N, the speculative decoder with
    the largest speedup over AR of the same backend (ties: the first), with its tokens per call and its speedup over
    the fused frame. Rows: ``backend``, ``nodes``, ``decoder``, ``tokens_per_call``, ``ms_per_frame``,
    ``speedup_vs_ar``, ``speedup_vs_fused``."""
    best: dict = {}
    for r in rows:
        if r.get("nodes") in (None, 1) or r.get("speedup_vs_ar") is None:
            continue
        key = (r["backend"], r["nodes"])
        if key not in best or r["speedup_vs_ar"] > best[key]["speedup_vs_ar"]:
            best[key] = r
    fused = {r["backend"]: r["ms_per_frame"] for r in rows if r["decoder"] == speed.FUSED}
    out = []
    for (b, n), r in sorted(best.items(), key=lambda kv: (BACKENDS.index(kv[0][0]) if kv[0][0] in BACKENDS else 99,
                                                          kv[0][1])):
        out.append({"backend": b, "nodes": n, "decoder": r["decoder"], "tokens_per_call": r["tokens_per_call"],
                    "ms_per_frame": r["ms_per_frame"], "speedup_vs_ar": r["speedup_vs_ar"],
                    "speedup_vs_fused": fused[b] / r["ms_per_frame"] if b in fused else None})
    return out


def summary_by_backend(rows: Sequence[dict]) -> list[dict]:
    """Per backend: AR's frame time, the fused frame's, the best speculative decoder's, and the two speedups (the
    targets of notebook 05: the best speculative decoder vs its own backend's AR loop, the fused frame beside)."""
    out = []
    for b in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == b]
        ar = next((r for r in mine if r.get("nodes") == 1), None)
        fused = next((r for r in mine if r["decoder"] == speed.FUSED), None)
        spec = [r for r in mine if r.get("nodes") not in (None, 1)]
        best = min(spec, key=lambda r: r["ms_per_frame"]) if spec else None
        out.append({"backend": b, "ar_ms": ar and ar["ms_per_frame"], "fused_ms": fused and fused["ms_per_frame"],
                    "best_decoder": best and best["decoder"], "best_nodes": best and best["nodes"],
                    "best_ms": best and best["ms_per_frame"],
                    "best_tokens_per_call": best and best["tokens_per_call"],
                    "best_speedup_vs_ar": best and ar and ar["ms_per_frame"] / best["ms_per_frame"],
                    "best_speedup_vs_fused": best and fused and fused["ms_per_frame"] / best["ms_per_frame"],
                    "fused_speedup_vs_ar": fused and ar and ar["ms_per_frame"] / fused["ms_per_frame"]})
    return out


def verify_costs(code_predictor, backends: Sequence[str] = ("eager", "onnx"), *,
                 query_sizes: Sequence[int] = speed.QUERY_SIZES, repeats: int = 20, warmup: int = 3,
                 work_dir=None, threads: int | None = None, random_weights: bool | None = None,
                 progress: bool = True, built: Mapping | None = None, noise_target: float | None = None,
                 max_repeats: int | None = None) -> dict:
    """The verify cost curve t(N)/t(1) per available backend (:func:`rvqspec_lib.eval.speed.verify_cost_curve`,
    interleaved, its ``noise_target`` and ``max_repeats`` too); ``absent`` lists the others. ``built``: backends
    already made (``{name: (backend, frame)}``)."""
    noise.repeat_cap(noise_target, repeats, max_repeats)  # bad settings fail before any export
    be, absent = {}, {}
    for name in backends:
        ok, why = backend_status(name)
        if not ok or name == "coreml":
            absent[name] = why or "Core ML calls are timed by coreml_call_times"
            continue
        be[name] = ((built or {}).get(name) or make_backend(name, code_predictor, work_dir=work_dir,
                                                            threads=threads, fused=False))[0]
    res = speed.verify_cost_curve(code_predictor, be, query_sizes=query_sizes, repeats=repeats, warmup=warmup,
                                  random_weights=random_weights, progress=progress, noise_target=noise_target,
                                  max_repeats=max_repeats) if be else {"rows": [],
                                                                                                  "meta": {}}
    res["absent"] = absent
    return res


def projected_speedup(expected_tokens: Mapping, cost_rows: Sequence[dict]) -> list[dict]:
    """``speedup(N) = E(N) x t(1) / t(N)`` per backend (docs/methods.md#choosing-the-node-budget): the speedup of a
    tree of node budget N over AR at the CALL level (loop overhead and the frame's prefill ignored).

    Args:
        expected_tokens: ``{N: E(N)}`` expected codes per call of the best tree of budget N (a calibration's
            ``call_expected_tokens`` of its better kind). cost_rows: :func:`verify_costs` rows.

    Returns:
        rows ``backend``, ``nodes``, ``expected_tokens``, ``cost_ratio`` (t(N)/t(1)), ``projected_speedup``.
    """
    cost = {(r["backend"], r["query_positions"]): r["ratio_to_q1"] for r in cost_rows}
    out = []
    for (b, n), ratio in sorted(cost.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        e = expected_tokens.get(n, expected_tokens.get(str(n)))
        if e is None or n == 1:
            continue
        out.append({"backend": b, "nodes": n, "expected_tokens": float(e), "cost_ratio": ratio,
                    "projected_speedup": float(e) / ratio})
    return out


def expected_tokens_per_call(calibration: dict) -> dict:
    """``{N: E(N)}`` from a calibration (:func:`rvqspec_lib.eval.calibration.calibrate`): the one-call expected
    codes of the better kind of tree at each budget."""
    return {int(n): calibration[kind]["call_expected_tokens"][n] for n, kind in calibration["best_kind"].items()}


# ----------------------------------------------------------------------------------------------------------------
# Core ML call times (macOS)
# ----------------------------------------------------------------------------------------------------------------
def coreml_call_times(code_predictor, work_dir, *, nodes: Sequence[int] = (2, 4, 8, 16, 32, 64),
                      compute_units: Sequence[str] = F.COREML_COMPUTE_UNITS, precision: str = "float16",
                      repeats: int = 20, warmup: int = 3, seed: int = 0, progress: bool = True) -> dict:
    """Time the Core ML packages call by call per compute unit (macOS 15+): the stepped graph, the fused verify
    graph at each N (a chain of N - 1 drafts: the cost of a call depends on N, not on the tree's shape) and the fused
    frame, interleaved within each compute unit. AR's frame is ``n_codes + 1`` stepped calls.

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per (compute unit, graph, N): ``compute_unit``, ``graph``,
        ``nodes``, ``median_ms``, ``p10_ms``, ``p90_ms``, ``ratio_to_stepped``.

    Raises:
        RuntimeError: not on macOS 15+ (the one-line reason names where to run it).
    """
    ok, why = F.coreml_available()
    if not ok:
        raise RuntimeError(why)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    files = {("stepped", 1): work / "stepped.mlpackage", ("frame", None): work / "frame.mlpackage"}
    files.update({("verify", n): work / f"verify-n{n}.mlpackage" for n in nodes})
    feeds = {}
    for (graph, n), path in files.items():
        F.export_graph(code_predictor, graph, "coreml", path, dtype=precision,
                       nodes=n if graph == "verify" else None)
        g = G.build_graph(code_predictor, graph, nodes=n if graph == "verify" else None, state="buffers")
        feeds[(graph, n)] = G.example_inputs(g, seed=seed)
    rows = []
    order = random.Random(seed)
    for unit in compute_units:
        runners = {k: F.CoreMLGraph(p, compute_unit=unit) for k, p in files.items()}
        keys = list(runners)
        times = {k: [] for k in keys}
        for _ in range(warmup):
            for k in keys:
                runners[k](feeds[k])
        for _ in progress_bar(range(repeats), desc=f"Core ML {unit}", enabled=progress, unit="repeat"):
            order.shuffle(keys)
            for k in keys:
                t0 = time.perf_counter()
                runners[k](feeds[k])
                times[k].append((time.perf_counter() - t0) * 1e3)
        base = statistics.median(times[("stepped", 1)])
        for (graph, n), ts in times.items():
            s = speed._summary(ts)
            rows.append({"compute_unit": unit, "graph": graph, "nodes": n, "median_ms": s["median"],
                         "p10_ms": s["p10"], "p90_ms": s["p90"], "ratio_to_stepped": s["median"] / base})
    return {"rows": rows, "meta": {**speed.run_meta(code_predictor), "precision": precision, "repeats": repeats,
                                   "macos": platform.mac_ver()[0], "machine": platform.machine()}}


# ----------------------------------------------------------------------------------------------------------------
# Device-side timing (GPU): interleaved conditions with the device synchronised
# ----------------------------------------------------------------------------------------------------------------
def time_conditions(conditions: Mapping[str, Callable[[torch.Tensor, torch.Generator], float | None]],
                    contexts: torch.Tensor, *, repeats: int = 20, warmup: int = 2, seed: int = 0,
                    progress: bool = True) -> dict:
    """Interleaved frame times of arbitrary conditions on the contexts' device, the device synchronised before each
    clock read (docs/style.md#benchmarks); generators are created on that device (a CUDA model samples with a CUDA
    generator). Each condition is ``f(context (1, 2, H), generator) -> tokens per call or None``.

    Returns:
        ``{label: {"median_ms", "p10_ms", "p90_ms", "tokens_per_call"}}``.

    Raises:
        ValueError: no condition, ``repeats < 1``.
    """
    if not conditions or repeats < 1:
        raise ValueError("need at least one condition and repeats >= 1")
    dev = contexts.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    keys = list(conditions)
    n_ctx = contexts.shape[0]
    for k in keys:
        for w in range(warmup):
            conditions[k](contexts[w % n_ctx: w % n_ctx + 1], torch.Generator(device=dev).manual_seed(seed + 10_000 + w))
    sync()
    times = {k: [] for k in keys}
    tpc = {k: [] for k in keys}
    order = random.Random(seed)
    for r in progress_bar(range(repeats), desc="frames", enabled=progress, unit="repeat"):
        ctx = contexts[r % n_ctx: r % n_ctx + 1]
        order.shuffle(keys)
        for k in keys:
            gen = torch.Generator(device=dev).manual_seed(seed + r)
            sync()
            t0 = time.perf_counter()
            out = conditions[k](ctx, gen)
            sync()
            times[k].append((time.perf_counter() - t0) * 1e3)
            if out is not None:
                tpc[k].append(float(out))
    res = {}
    for k in conditions:
        s = speed._summary(times[k])
        res[k] = {"median_ms": s["median"], "p10_ms": s["p10"], "p90_ms": s["p90"],
                  "tokens_per_call": statistics.fmean(tpc[k]) if tpc[k] else None}
    return res


def device_verify_costs(code_predictor, backend, *, label: str = "cuda",
                        query_sizes: Sequence[int] = speed.QUERY_SIZES, prefix_len: int = speed.PREFIX_LEN,
                        repeats: int = 20, warmup: int = 3, seed: int = 0, progress: bool = True) -> dict:
    """The verify cost curve t(N)/t(1) of ONE backend on the model's device, the device synchronised around each
    call (the GPU leg of :func:`verify_costs`; the calls are :func:`rvqspec_lib.eval.speed.verify_cost_curve`'s).

    Returns:
        ``{"rows", "meta"}``, rows as ``verify_cost_curve``'s (``backend`` = ``label``).
    """
    qs = sorted({int(q) for q in query_sizes})
    if 1 not in qs:
        raise ValueError(f"query_sizes must include 1 (the ratio's reference), got {query_sizes}")
    calls = {q: speed._verify_call(code_predictor, backend, q, prefix_len, seed) for q in qs}
    ctx = torch.zeros(1, 1, device=next(code_predictor.parameters()).device)
    t = time_conditions({q: (lambda c, g, f=f: (f(), None)[1]) for q, f in calls.items()}, ctx, repeats=repeats,
                        warmup=warmup, seed=seed, progress=progress)
    base = t[1]["median_ms"]
    rows = [{"backend": label, "query_positions": q, "median_ms": t[q]["median_ms"], "p10_ms": t[q]["p10_ms"],
             "p90_ms": t[q]["p90_ms"], "ratio_to_q1": t[q]["median_ms"] / base} for q in qs]
    return {"rows": rows, "meta": {**speed.run_meta(code_predictor), "repeats": repeats, "prefix_len": prefix_len}}


# ----------------------------------------------------------------------------------------------------------------
# What `rvqspec bench --backend NAME` runs
# ----------------------------------------------------------------------------------------------------------------
def bench_backend(name: str, code_predictor, contexts: torch.Tensor, *, decoders: Mapping | None = None,
                  repeats: int = 20, warmup: int = 2, seed: int = 0, threads: int | None = None, work_dir=None,
                  random_weights: bool | None = None, progress: bool = True,
                  fused_chains: Sequence[int] = (4,), acceptance=None) -> dict:
    """Frame times of AR, the fused frame and speculative decoders through ONE backend (what ``rvqspec bench
    --backend NAME`` prints): :func:`frame_times` with ``backends=[name]`` plus its :func:`summary_by_backend` row.

    Args:
        name: one of :data:`BACKENDS`. decoders: default AR, ``Chain(4)`` and the default tree.
        fused_chains: windows of the fused speculative chain timed beside them (``eager``, ``compile`` and ``onnx``;
            default ``(4,)``, the row ``fused-chain4``; none in a timing replay).
        acceptance: a timing replay's oracle (:func:`frame_times`).
        Others as :func:`frame_times`.

    Returns:
        ``{"rows", "summary", "meta", "build_s"}``.

    Raises:
        ValueError: an unknown backend, or one absent here (one line with the reason); ``coreml`` (its packages
            are timed call by call: ``rvqspec export --format coreml`` on a Mac).
    """
    ok, why = backend_status(name)
    if not ok:
        raise ValueError(f"backend {name} is not available here: {why}")
    if name == "coreml":
        raise ValueError("Core ML packages are timed call by call on a Mac (notebook 05, coreml_call_times), not "
                         "through bench")
    decoders = decoders or {"AR": AR(), "chain4": Chain(4), "tree": Tree()}
    res = frame_times(code_predictor, contexts, decoders, [name], repeats=repeats, warmup=warmup, seed=seed,
                      threads=threads, work_dir=work_dir, random_weights=random_weights, progress=progress,
                      fused_chains=() if acceptance is not None else fused_chains, acceptance=acceptance)
    return {"rows": res["rows"], "summary": summary_by_backend(res["rows"]), "meta": res["meta"],
            "build_s": res["build_s"]}


# ----------------------------------------------------------------------------------------------------------------
# Figure
# ----------------------------------------------------------------------------------------------------------------
def plot_speedup_vs_n(measured: Sequence[dict], projected: Sequence[dict] = (), *, fused: Sequence[dict] = (),
                      paper: Sequence[dict] = PAPER_DEVICE_SPEEDUPS, title: str = "", figsize=(7.5, 4.2)):
    """Figure 4's analogue: speedup over AR of the same backend vs node budget N.

    Args:
        measured: :func:`speedup_vs_n` rows (solid lines, one per backend). projected: :func:`projected_speedup`
            rows (dashed). fused: :func:`summary_by_backend` rows (the fused frame's speedup over AR as a dotted
            horizontal line per backend). paper: the paper's device numbers (black markers, labelled as the
            paper's). title: the figure title (device, dtype, threads, weights).

    Returns:
        the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    colors = {}
    for i, b in enumerate(dict.fromkeys([r["backend"] for r in measured] + [r["backend"] for r in projected])):
        colors[b] = f"C{i}"
    for b in dict.fromkeys(r["backend"] for r in measured):
        rs = sorted((r for r in measured if r["backend"] == b), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in rs], [r["speedup_vs_ar"] for r in rs], "o-", color=colors[b],
                label=f"{b}: measured frames")
    for b in dict.fromkeys(r["backend"] for r in projected):
        rs = sorted((r for r in projected if r["backend"] == b), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in rs], [r["projected_speedup"] for r in rs], "s--", color=colors[b], alpha=0.7,
                label=f"{b}: projected E(N) t(1)/t(N)")
    for r in fused:
        if r.get("fused_speedup_vs_ar"):
            ax.axhline(r["fused_speedup_vs_ar"], color=colors.get(r["backend"], "grey"), ls=":", lw=1,
                       label=f"{r['backend']}: fused AR frame")
    for i, p in enumerate(paper):
        ax.plot([p["nodes"]], [p["speedup"]], marker="*^vD"[i % 4], color="k", ls="none", ms=9,
                label=f"{p['device']}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("node budget N (query positions of one verify call)")
    ax.set_ylabel("speedup over AR (same backend)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best", ncol=2)
    fig.tight_layout()
    return fig
