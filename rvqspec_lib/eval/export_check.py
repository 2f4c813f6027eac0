"""The exported code-predictor graphs against eager PyTorch in float32 (notebook 06, ``rvqspec export``;
:data:`RELATIVE_TOLERANCE`), and Core ML call times on macOS (:func:`coreml_call_times`). Frame times per backend:
:func:`rvqspec_lib.eval.speed.time_frames`."""

from __future__ import annotations

import platform
import statistics
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from rvqspec_lib.eval.timing import interleaved, machine_meta
from rvqspec_lib.device import export_formats as F
from rvqspec_lib.device import export_graphs as G

#: Largest max abs logit difference an exported graph may show against eager PyTorch (the official module in
#: float32), relative to the largest reference logit: float32 graphs differ by summation order only (~1e-7);
#: float16 graphs by float16 rounding of weights and activations (2^-11 relative per operation, over 2-5 layers).
#: A Core ML package keeps its KV cache in float16 states whatever its precision, so both its precisions get the
#: float16 tolerance.
RELATIVE_TOLERANCE = {"float32": 1e-5, "float16": 2e-2}
#: Node budgets of the fused verify graphs :func:`coreml_call_times` times.
COREML_NODES = (2, 4, 8, 16, 32, 64)


def tolerance(fmt: str, dtype: str) -> float:
    """The :data:`RELATIVE_TOLERANCE` of a (format, dtype): Core ML packages, float16 states, get float16's."""
    return RELATIVE_TOLERANCE["float16" if fmt == "coreml" else dtype]


def numerical_agreement(code_predictor, *, graphs: Sequence[str] = G.GRAPHS, dtypes: Sequence[str] = ("float32",
                        "float16"), formats: Sequence[str] = ("onnx", "coreml"), nodes: int = 4, tree=None,
                        work_dir=None, seeds: Sequence[int] = (0, 1),
                        compute_units: Sequence[str] = F.COREML_COMPUTE_UNITS, keep_files: bool = False) -> dict:
    """Export every (graph, format, dtype) of the float32 official module, run it where it can run and compare it
    with eager PyTorch (:func:`check_file`); ``nodes``, ``tree``: the verify graph's; ``work_dir`` default a
    temporary folder, removed unless ``keep_files``.

    Returns:
        ``{"rows": [...], "meta": {...}}``; a row per (graph, format, dtype, runner): ``graph``, ``format``,
        ``dtype``, ``nodes``, ``interface_ok`` (declared == written), ``bytes``, ``export_s``, ``path``, and
        :func:`check_file`'s fields.

    Raises:
        ValueError: what the exporter refuses (an unknown graph, format or dtype; one line).
    """
    tmp = tempfile.TemporaryDirectory(prefix="rvqspec-export-") if work_dir is None else None
    work = Path(tmp.name if tmp is not None else work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for graph in graphs:
            n, tr = (nodes, tree) if graph == "verify" else (None, None)
            for fmt in formats:
                for dt in dtypes:
                    path = work / f"{graph}-{dt}{F.FORMATS[fmt]}"
                    res = F.export_graph(code_predictor, graph, fmt, path, dtype=dt, nodes=n, tree=tr)
                    base = {"graph": graph, "format": fmt, "dtype": dt, "nodes": res["nodes"],
                            "interface_ok": res["declared"] == res["written"], "bytes": res["bytes"],
                            "export_s": round(res["export_s"], 1), "path": str(path) if keep_files else None}
                    rows += [{**base, **r} for r in check_file(code_predictor, graph, path, dtype=dt, nodes=n, tree=tr,
                                                                 seeds=seeds, compute_units=compute_units)]
    finally:
        if tmp is not None and not keep_files:
            tmp.cleanup()
    return {"rows": rows, "meta": {**machine_meta(code_predictor), "seeds": list(seeds),
                                   "tolerance": RELATIVE_TOLERANCE, "reference": "official module, float32, eager"}}


def check_file(code_predictor, graph: str, path, *, dtype: str = "float32", nodes: int | None = None, tree=None,
               seeds: Sequence[int] = (0, 1), compute_units: Sequence[str] = F.COREML_COMPUTE_UNITS) -> list[dict]:
    """Run an exported ``.onnx`` or ``.mlpackage`` of ``graph`` (``stepped``, ``verify``, ``frame``) where it can run,
    against eager PyTorch (the official module, float32) on the graph's example inputs of each seed; ``dtype`` the
    file's precision, ``nodes``, ``tree`` the verify graph's.

    Returns:
        a row per runner (``onnxruntime-cpu``, ``coreml-<unit>`` on macOS 15+), or one ``not run`` row with the
        reason in ``note``: ``runner``, ``ran``, ``max_abs_logit_diff`` (over every logit output and seed),
        ``max_abs_logit``, ``relative_diff``, ``tolerance`` (:func:`tolerance`), ``within_tolerance``,
        ``max_abs_cache_diff``, ``codes_equal_frac`` (frame graph: share of codes equal to eager), ``note``.
    """
    fmt = "onnx" if Path(path).suffix == ".onnx" else "coreml"
    ref_graph = G.build_graph(code_predictor, graph, nodes=nodes, tree=tree)
    refs = [(inp, G.reference_outputs(ref_graph, inp)) for inp in (G.example_inputs(ref_graph, seed=s) for s in seeds)]
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
            # ONNX graphs take their floating inputs in their dtype (the sampling noise stays float32)
            feed = {k: v.to(F.DTYPES[dtype]) if fmt == "onnx" and v.is_floating_point() and k != "noise" else v
                    for k, v in inp.items()}
            names = getattr(runner, "output_names", None)
            cmp.append(_compare(runner(feed), {k: v for k, v in ref.items() if names is None or k in names}))
        rows.append({"runner": runner_name, "ran": True, **_summarise(cmp, dtype, tolerance(fmt, dtype)),
                     "note": ""})
    return rows


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


def _write_state(runner, inp: dict) -> None:
    """Core ML: the example's cache goes into the package's state before the call (states start at zero)."""
    if "k_cache" in inp and hasattr(runner.state, "write_state"):
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


def coreml_call_times(code_predictor, work_dir, *, nodes: Sequence[int] = COREML_NODES,
                      compute_units: Sequence[str] = F.COREML_COMPUTE_UNITS, precision: str = "float16",
                      repeats: int = 20, warmup: int = 3, seed: int = 0, progress: bool = True) -> dict:
    """Time the Core ML packages call by call per compute unit (macOS 15+): the stepped graph, the fused verify graph
    at each N (a chain of N - 1 drafts: the cost of a call depends on N, not on the tree's shape) and the fused
    frame, interleaved within each compute unit. AR's frame is ``n_codes + 1`` stepped calls, so ``ratio_to_stepped``
    is the verify cost curve t(N)/t(1) of each compute unit.

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
        n_nodes = n if graph == "verify" else None
        F.export_graph(code_predictor, graph, "coreml", path, dtype=precision, nodes=n_nodes)
        feeds[(graph, n)] = G.example_inputs(G.build_graph(code_predictor, graph, nodes=n_nodes, state="buffers"),
                                             seed=seed)
    rows, meta = [], {}
    for unit in compute_units:
        graphs = {k: F.CoreMLGraph(p, compute_unit=unit) for k, p in files.items()}
        t = interleaved({k: (lambda _i, g=g, f=feeds[k]: g(f)) for k, g in graphs.items()}, repeats=repeats,
                        warmup=warmup, seed=seed, progress=progress, desc=f"Core ML {unit}", module=code_predictor)
        base = t.summary(("stepped", 1))["median_ms"]
        for (graph, n) in files:
            s = t.summary((graph, n))
            rows.append({"compute_unit": unit, "graph": graph, "nodes": n, "median_ms": s["median_ms"],
                         "p10_ms": s["p10_ms"], "p90_ms": s["p90_ms"], "ratio_to_stepped": s["median_ms"] / base})
        meta = t.meta
    return {"rows": rows, "meta": {**meta, "precision": precision, "macos": platform.mac_ver()[0],
                                   "machine": platform.machine()}}
