"""An exported code-predictor graph (``.onnx``, ``.mlpackage``) run where it can run and compared with eager PyTorch
in float32 (:func:`check_file`, within :data:`RELATIVE_TOLERANCE`). Every graph at once, and Core ML call times:
:mod:`rvqspec_lib.eval.export_check`."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from rvqspec_lib.device import export_formats as F
from rvqspec_lib.device import export_graphs as G


#: Largest max abs logit difference an exported graph may show against eager PyTorch (the official module in
#: float32), relative to the largest reference logit: float32 graphs differ by summation order only (~1e-7);
#: float16 graphs by float16 rounding of weights and activations (2^-11 relative per operation, over 2-5 layers).
#: A Core ML package keeps its KV cache in float16 states whatever its precision, so both its precisions get the
#: float16 tolerance.
RELATIVE_TOLERANCE = {"float32": 1e-5, "float16": 2e-2}


def tolerance(fmt: str, dtype: str) -> float:
    """The :data:`RELATIVE_TOLERANCE` of a (format, dtype): Core ML packages, float16 states, get float16's."""
    return RELATIVE_TOLERANCE["float16" if fmt == "coreml" else dtype]


def check_file(code_predictor, graph: str, path, *, dtype: str = "float32", nodes: int | None = None, tree=None,
               seeds: Sequence[int] = (0, 1)) -> list[dict]:
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
        runners = [(f"coreml-{u}", lambda u=u: F.CoreMLGraph(path, compute_unit=u)) for u in F.COREML_COMPUTE_UNITS]
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
