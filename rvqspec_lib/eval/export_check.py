"""Core ML call times on macOS (:func:`coreml_call_times`); one exported graph against eager PyTorch:
:func:`rvqspec_lib.device.export_check.check_file`. Frame times per backend: :func:`rvqspec_lib.eval.speed.time_frames`.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Sequence

from rvqspec_lib.eval.timing import interleaved
from rvqspec_lib.device import export_formats as F
from rvqspec_lib.device import export_graphs as G

#: Node budgets of the fused verify graphs :func:`coreml_call_times` times.
COREML_NODES = (2, 4, 8, 16, 32, 64)


def coreml_call_times(code_predictor, work_dir, *, nodes: Sequence[int] = COREML_NODES, repeats: int = 20,
                      progress: bool = True) -> dict:
    """Time the float16 Core ML packages call by call per compute unit (macOS 15+; 3 warm-up rounds, seed 0): the
    stepped graph, the fused verify graph at each N (a chain of N - 1 drafts: the cost of a call depends on N, not on
    the tree's shape) and the fused frame, interleaved within each compute unit. AR's frame is ``n_codes + 1`` stepped calls, so ``ratio_to_stepped``
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
        F.export_graph(code_predictor, graph, "coreml", path, dtype="float16", nodes=n_nodes)
        feeds[(graph, n)] = G.example_inputs(G.build_graph(code_predictor, graph, nodes=n_nodes, state="buffers"))
    rows, meta = [], {}
    for unit in F.COREML_COMPUTE_UNITS:
        graphs = {k: F.CoreMLGraph(p, compute_unit=unit) for k, p in files.items()}
        t = interleaved({k: (lambda _i, g=g, f=feeds[k]: g(f)) for k, g in graphs.items()}, repeats=repeats,
                        warmup=3, progress=progress, desc=f"Core ML {unit}", module=code_predictor)
        base = t.summary(("stepped", 1))["median_ms"]
        for (graph, n) in files:
            s = t.summary((graph, n))
            rows.append({"compute_unit": unit, "graph": graph, "nodes": n, "median_ms": s["median_ms"],
                         "p10_ms": s["p10_ms"], "p90_ms": s["p90_ms"], "ratio_to_stepped": s["median_ms"] / base})
        meta = t.meta
    return {"rows": rows, "meta": {**meta, "precision": "float16", "macos": platform.mac_ver()[0],
                                   "machine": platform.machine()}}
