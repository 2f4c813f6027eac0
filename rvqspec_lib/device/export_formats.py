"""The exported graphs as files, and running them: ONNX (run here with ONNX Runtime) and Core ML (built anywhere, run
on macOS 15+ only; docs/offline.md#export-targets). :func:`export_graph` writes a graph, :func:`file_interface` reads
back what a file declares, :class:`OrtGraph` / :class:`CoreMLGraph` run one, :class:`ExportedBackend` is a verify
backend and :class:`ExportedFrame` a fused frame through exported files.

Float16: ONNX graphs are exported from a float16 COPY of the code predictor; Core ML float16 is coremltools'
compute precision over the float32 trace (float32 inputs and outputs, float16 states).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from rvqspec_lib.device import export_graphs as G
from rvqspec_lib.device.fused import FusedARFrame
from rvqspec_lib.device.lean import LeanCache, SlotBackend
from rvqspec_lib.decoding import predictor as P

#: File formats and the suffix each writes.
FORMATS = {"onnx": ".onnx", "coreml": ".mlpackage"}
#: Precisions a graph is exported in.
DTYPES = {"float32": torch.float32, "float16": torch.float16}
#: ONNX opset of the exported files (the torch exporter's default in torch 2.13; ONNX Runtime 1.32 runs it).
ONNX_OPSET = 18
#: Core ML compute units a package is timed on (macOS): CPU only, CPU and GPU, CPU and Neural Engine.
COREML_COMPUTE_UNITS = ("CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")
#: Core ML deployment targets: StateType needs macOS 15 / iOS 18.
COREML_TARGETS = ("macOS15", "iOS18")
#: Where to run Core ML predictions (the one-line error on other systems).
COREML_WHERE = ("Core ML prediction runs on macOS 15+ only: on this system the package is built, not run; copy it "
                "to a Mac and run the same command there")

_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.int32: np.int32, torch.int64: np.int64}


def _dtype_of(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"unknown dtype {dtype!r}: use float16 or float32")


@contextlib.contextmanager
def _quiet():
    """Silence the exporters' progress prints and warnings (the command prints its own one-line summary)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "coremltools",
                                              "onnxscript", "torch.fx.experimental.symbolic_shapes")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    buf = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


#: What coremltools logs at import that says nothing about the package being built: its native library is macOS-only,
#: its scikit-learn converter is never used, and this project pins the torch it tests with.
COREML_IMPORT_NOISE = ("Failed to load _ML", "Failed to load '_ML", "has not been tested with coremltools",
                       "scikit-learn version")


class _ImportNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in record.getMessage() for n in COREML_IMPORT_NOISE)


def import_coremltools():
    """``import coremltools`` without the log lines of :data:`COREML_IMPORT_NOISE` (any other still shows).

    Raises:
        ImportError: coremltools is not installed.
    """
    if "coremltools" in sys.modules:
        return sys.modules["coremltools"]
    lg, noise = logging.getLogger("coremltools"), _ImportNoise()
    lg.addFilter(noise)
    try:  # imported here, on first use: coremltools takes 6.5 s to import (measured), onnx 2 s
        import coremltools
    finally:
        lg.removeFilter(noise)
    return coremltools


def coreml_available() -> tuple[bool, str]:
    """Whether Core ML packages can be RUN here (macOS 15+ with coremltools' native library): ``(ok, why)``."""
    if platform.system() != "Darwin":
        return False, f"{platform.system()} is not macOS: " + COREML_WHERE
    ver = tuple(int(x) for x in (platform.mac_ver()[0] or "0").split(".")[:2] if x.isdigit())
    if ver < (15,):
        return False, f"macOS {platform.mac_ver()[0]} is older than 15 (Core ML states need macOS 15)"
    try:  # the native library itself, which loads on macOS only
        from coremltools.libcoremlpython import _MLModelProxy
        del _MLModelProxy  # importing it is the check
    except ImportError as e:
        return False, f"coremltools' native library does not load ({e})"
    return True, ""


def graph_for_format(code_predictor, graph: str, fmt: str, dtype, *, nodes: int | None = None, tree=None,
                     sampling=None):
    """The graph to export over :func:`module_for_format`'s module; Core ML graphs hold their cache as buffers."""
    return G.build_graph(module_for_format(code_predictor, fmt, dtype), graph, nodes=nodes, tree=tree,
                         sampling=sampling, state="buffers" if fmt == "coreml" else "inputs")


def module_for_format(code_predictor, fmt: str, dtype):
    """The code predictor a graph of ``fmt`` in ``dtype`` is built over: itself, or a COPY in the export's dtype
    (Core ML: float32, its float16 being a compute precision)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    G.check_exportable(code_predictor)
    want = _dtype_of(dtype) if fmt == "onnx" else torch.float32
    return code_predictor if P.param_dtype(code_predictor) == want else copy.deepcopy(code_predictor).to(want)


def _write_atomically(path: Path, write) -> None:
    """Write through a temporary sibling, renamed into place at the end (never a half-written output)."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")  # the same suffix: coremltools checks it
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    try:
        write(tmp)
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()


def export_onnx(graph, path, *, dynamic: bool = False) -> Path:
    """Export a graph (``state="inputs"``) to one ``.onnx`` file at ``path`` (weights inside); returns ``path``.
    ``dynamic``: batch, query and slot dimensions symbolic (hidden-state verify graphs only: one file for every N)."""
    inputs = G.example_inputs(graph)
    names = [s.name for s in graph.input_specs()]
    dyn = None
    if dynamic:
        if not (isinstance(graph, G.VerifyGraph) and graph.outputs == "hidden"):
            raise ValueError("dynamic shapes are for hidden-state verify graphs only")
        b, q, s = torch.export.Dim("batch", max=64), torch.export.Dim("query", max=G.MAX_NODES), \
            torch.export.Dim("slots", max=256)
        dyn = ({0: b, 1: q}, {0: b, 1: q}, {0: b, 1: q, 2: s}, {0: b, 1: q}, {1: b, 3: s}, {1: b, 3: s})
    args = tuple(inputs[n] for n in names)

    def write(tmp: Path) -> None:
        with _quiet():
            # optimize=False: onnxscript's optimiser takes minutes on the frame graph's 15 unrolled steps; ONNX
            # Runtime applies its own graph optimisations when a session is created
            torch.onnx.export(graph, args, str(tmp), dynamo=True, input_names=names,
                              output_names=[s.name for s in graph.output_specs()], opset_version=ONNX_OPSET,
                              external_data=False, dynamic_shapes=dyn, verbose=False, report=False, optimize=False)
    _write_atomically(Path(path), write)
    return Path(path)


def export_coreml(graph, path, *, precision: str = "float16", target: str = "macOS15") -> Path:
    """Convert a graph (``state="buffers"`` for stepped and verify graphs) to a Core ML ``.mlpackage`` through
    ``torch.export``, the buffers as states, in compute ``precision`` (of :data:`DTYPES`) for ``target``
    (:data:`COREML_TARGETS`).

    Raises:
        ValueError: an unknown precision or target, a graph whose cache is not held in buffers.
    """
    ct = import_coremltools()

    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}: use float16 or float32")
    if target not in COREML_TARGETS:
        raise ValueError(f"unknown Core ML target {target!r}: use one of {', '.join(COREML_TARGETS)} (states need "
                         "them)")
    if getattr(graph, "state", "none") == "inputs":
        raise ValueError("Core ML graphs hold their KV cache as states: build them with state='buffers'")
    inputs = G.example_inputs(graph)
    names = [s.name for s in graph.input_specs()]
    with _quiet(), torch.no_grad():
        ep = torch.export.export(graph, tuple(inputs[n] for n in names))
        ep = ep.run_decompositions({})
        states = [ct.StateType(ct.TensorType(shape=s.shape, dtype=_NP[s.dtype]), name=s.name)
                  for s in graph.state_specs()]
        ml = ct.convert(ep, outputs=[ct.TensorType(name=s.name) for s in graph.output_specs()],
                        states=states or None, minimum_deployment_target=getattr(ct.target, target),
                        compute_precision=ct.precision.FLOAT16 if precision == "float16" else ct.precision.FLOAT32,
                        convert_to="mlprogram", skip_model_load=True)
    ml.short_description = f"rvqspec {graph.graph} graph of the Qwen3-TTS code predictor ({precision})"
    _write_atomically(Path(path), lambda tmp: ml.save(str(tmp)))
    return Path(path)


def export_graph(code_predictor, graph: str, fmt: str, out, *, dtype="float32", nodes: int | None = None,
                 tree=None, sampling=None, target: str = "macOS15") -> dict:
    """Build and write one graph (what ``rvqspec export`` does) over ``code_predictor`` (never modified): ``graph`` of
    ``export_graphs.GRAPHS``, ``fmt`` of :data:`FORMATS`, ``dtype`` of :data:`DTYPES`; the other keywords the
    graph's (:func:`~rvqspec_lib.device.export_graphs.build_graph`) and Core ML's ``target``.

    Returns:
        ``{"path", "format", "graph", "dtype", "nodes", "bytes", "export_s", "declared": {inputs, outputs, states},
        "written": file_interface(path)}``.

    Raises:
        ValueError: an unknown format, graph or dtype, N outside 2..64, a code predictor that cannot be exported.
    """
    dt_name = dtype if isinstance(dtype, str) else {v: k for k, v in DTYPES.items()}.get(dtype, str(dtype))
    _dtype_of(dt_name)
    g = graph_for_format(code_predictor, graph, fmt, dt_name, nodes=nodes, tree=tree, sampling=sampling)
    t0 = time.perf_counter()
    if fmt == "onnx":
        export_onnx(g, out)
    else:
        export_coreml(g, out, precision=dt_name, target=target)
    return {"path": str(out), "format": fmt, "graph": graph, "dtype": dt_name,
            "nodes": getattr(g, "n_query", None), "bytes": path_bytes(out),
            "export_s": time.perf_counter() - t0, "declared": declared_interface(g, fmt, dt_name),
            "written": file_interface(out)}


def path_bytes(path) -> int:
    """Size of a file, or of every file under a folder (an ``.mlpackage``)."""
    p = Path(path)
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _dt_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def declared_interface(graph, fmt: str, dtype: str = "float32") -> dict:
    """What a graph declares, in :func:`file_interface`'s form (Core ML: float inputs float32, float outputs in the
    package's precision, states float16)."""
    def row(s, io):
        dt = _dt_name(s.dtype)
        if fmt == "coreml" and s.dtype.is_floating_point:
            dt = "float32" if io == "in" else dtype
        return [s.name, list(s.shape), dt]
    return {"inputs": [row(s, "in") for s in graph.input_specs()],
            "outputs": [row(s, "out") for s in graph.output_specs()],
            "states": [[s.name, list(s.shape), _dt_name(s.dtype)] for s in graph.state_specs()]
            if fmt == "coreml" else []}


_ONNX_TYPES = {1: "float32", 10: "float16", 6: "int32", 7: "int64", 9: "bool"}
_COREML_TYPES = {65568: "float32", 65552: "float16", 131104: "int32", 65600: "float64"}


def file_interface(path) -> dict:
    """The inputs, outputs and states a written ``.onnx`` or ``.mlpackage`` declares, read from the file:
    ``{"inputs": [[name, shape, dtype]], "outputs": [...], "states": [...]}`` (dtype names as torch's)."""
    p = Path(path)
    if p.suffix == ".onnx":
        import onnx  # on first use: importing onnx takes 2 s (measured)

        m = onnx.load(str(p), load_external_data=False)

        def rows(vals):
            return [[v.name, [d.dim_value if d.HasField("dim_value") else d.dim_param
                              for d in v.type.tensor_type.shape.dim],
                     _ONNX_TYPES.get(v.type.tensor_type.elem_type, str(v.type.tensor_type.elem_type))] for v in vals]
        return {"inputs": rows(m.graph.input), "outputs": rows(m.graph.output), "states": []}
    if p.suffix == ".mlpackage":
        ct = import_coremltools()

        with _quiet():
            spec = ct.utils.load_spec(str(p))
        d = spec.description

        def arr(t):
            return [list(t.shape), _COREML_TYPES.get(int(t.dataType), str(t.dataType))]
        return {"inputs": [[v.name, *arr(v.type.multiArrayType)] for v in d.input],
                "outputs": [[v.name, *arr(v.type.multiArrayType)] for v in d.output],
                "states": [[v.name, *arr(v.type.stateType.arrayType)] for v in d.state]}
    raise ValueError(f"{path} is neither an .onnx file nor an .mlpackage")


# ---- Running exported files ------------------------------------------------------------------------------------------
def ort_session(path):
    """An ONNX Runtime CPU session of ``path``: torch's thread count of intra-op threads, one inter-op thread, every
    graph optimisation."""
    import onnxruntime as ort  # an optional package (backends.available says so when it is missing)

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(torch.get_num_threads())
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class OrtGraph:
    """An exported ``.onnx`` graph run with ONNX Runtime on the CPU: ``graph(inputs)`` with ``{name: tensor}``
    (torch or numpy) returns ``{output name: torch tensor}``."""

    def __init__(self, path):
        self.path = Path(path)
        self.session = ort_session(path)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, inputs: dict) -> dict:
        feed = {n: (inputs[n].detach().cpu().numpy() if isinstance(inputs[n], torch.Tensor) else inputs[n])
                for n in self.input_names}
        return dict(zip(self.output_names, (torch.from_numpy(o) for o in self.session.run(None, feed))))


class CoreMLGraph:
    """An ``.mlpackage`` run with Core ML (macOS 15+ only) on one compute unit; states (the KV cache) are kept
    across calls until :meth:`reset_state`.

    Raises:
        RuntimeError: not on macOS 15+ (one line naming where to run it).
    """

    def __init__(self, path, *, compute_unit: str = "CPU_ONLY"):
        ok, why = coreml_available()
        if not ok:
            raise RuntimeError(why)
        ct = import_coremltools()

        if compute_unit not in COREML_COMPUTE_UNITS + ("ALL",):
            raise ValueError(f"unknown compute unit {compute_unit!r}: use one of {COREML_COMPUTE_UNITS}")
        self.path, self.compute_unit = Path(path), compute_unit
        self.model = ct.models.MLModel(str(path), compute_units=getattr(ct.ComputeUnit, compute_unit))
        spec = self.model.get_spec().description
        self.input_names = [v.name for v in spec.input]
        self.output_names = [v.name for v in spec.output]
        self.has_state = len(spec.state) > 0
        self.state = self.model.make_state() if self.has_state else None

    def reset_state(self) -> None:
        """A fresh state (zeros): a new frame."""
        if self.has_state:
            self.state = self.model.make_state()

    def __call__(self, inputs: dict) -> dict:
        feed = {n: np.ascontiguousarray((inputs[n].detach().cpu().numpy() if isinstance(inputs[n], torch.Tensor)
                                         else inputs[n])
                                        .astype(np.int32 if np.issubdtype(np.asarray(inputs[n]).dtype, np.integer)
                                                else np.float32)) for n in self.input_names}
        out = self.model.predict(feed, state=self.state) if self.has_state else self.model.predict(feed)
        return {k: torch.from_numpy(np.asarray(v)) for k, v in out.items()}


def open_graph(path):
    """:class:`OrtGraph` for ``.onnx``, :class:`CoreMLGraph` (CPU only) for ``.mlpackage``."""
    if Path(path).suffix == ".onnx":
        return OrtGraph(path)
    if Path(path).suffix == ".mlpackage":
        return CoreMLGraph(path)
    raise ValueError(f"{path} is neither an .onnx file nor an .mlpackage")


class _WorkFolder:
    """Where an exported backend writes its graph: a temporary folder removed with it."""

    _tmp = None

    def _work_folder(self) -> Path:
        self._tmp = tempfile.TemporaryDirectory(prefix="rvqspec-ort-")
        return Path(self._tmp.name)


class ExportedBackend(_WorkFolder, SlotBackend):
    """The verify backend over an exported hidden-state verify graph (symbolic dimensions: one file for every
    decoder), exported to a temporary folder and run by ONNX Runtime in ``dtype`` (hidden states come back in the
    module's) on torch's thread count. Raises ValueError: a code predictor that cannot be exported."""

    def __init__(self, code_predictor, *, dtype: str = "float32"):
        G.check_exportable(code_predictor)
        self.code_predictor = code_predictor
        self.dtype_name = dtype
        self.graph_dtype = _dtype_of(dtype)
        self.dtype = P.param_dtype(code_predictor)
        self.n_layers = len(code_predictor.model.layers)
        self.n_kv, self.head_dim = int(code_predictor.config.num_key_value_heads), P.head_dim(code_predictor.config)
        self.cache_dtype, self.device = self.graph_dtype, torch.device("cpu")
        t0 = time.perf_counter()
        self.path = self._work_folder() / f"verify-hidden-{dtype}.onnx"
        g = G.VerifyGraph(module_for_format(code_predictor, "onnx", dtype), 4, outputs="hidden").eval()
        export_onnx(g, self.path, dynamic=True)
        self.export_s = time.perf_counter() - t0
        self.graph = OrtGraph(self.path)
        self._np = _NP[self.graph_dtype]
        self.name = "onnxruntime" + ("-fp16" if self.graph_dtype == torch.float16 else "")

    def forward(self, embeds, positions, allow, cache: LeanCache, write_slots):
        """The verify call through ONNX Runtime (the cache it returns replaces the one given)."""
        out = self.graph.session.run(None, {
            "inputs_embeds": embeds.detach().to(self.graph_dtype).numpy(),
            "positions": positions.to(torch.int32).numpy(),
            "attention_mask": allow.numpy().astype(self._np),
            "write_slots": write_slots.to(torch.int32).numpy(),
            "k_cache": cache.k.numpy(), "v_cache": cache.v.numpy()})
        cache.k, cache.v = torch.from_numpy(out[1]), torch.from_numpy(out[2])
        return torch.from_numpy(out[0]).to(self.dtype)

    def __repr__(self) -> str:
        return f"ExportedBackend({self.path.name})"


class ExportedFrame(_WorkFolder, FusedARFrame):
    """A :class:`~rvqspec_lib.device.fused.FusedARFrame` whose call runs an exported frame graph at ``path``
    (``.onnx`` / ``.mlpackage`` of batch 1; ``None``: one exported to ONNX in float32 in a temporary folder, with
    ``sampling`` as :func:`export_graph`'s) run by :func:`open_graph`."""

    def __init__(self, code_predictor, path=None, *, sampling=None):
        FusedARFrame.__init__(self, code_predictor, sampling, compile=False)
        self.batch = 1
        t0 = time.perf_counter()
        if path is None:
            path = self._work_folder() / "frame-b1-float32.onnx"
            export_graph(code_predictor, "frame", "onnx", path, dtype="float32", sampling=sampling)
        self.export_s = time.perf_counter() - t0
        self.graph = open_graph(path)
        self._context_dtype = torch.float16 if isinstance(self.graph, OrtGraph) and \
            self.graph.session.get_inputs()[0].type == "tensor(float16)" else torch.float32
        self.name = "fused-AR-" + ("onnxruntime" if Path(path).suffix == ".onnx" else "coreml")

    def __call__(self, context: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Codes ``(B, n_codes)`` int64 for given noise.

        Raises:
            ValueError: a batch other than the graph's.
        """
        if context.shape[0] != self.batch:
            raise ValueError(f"this exported frame graph takes batch {self.batch}, got {context.shape[0]}")
        return self.graph({"context": context.to(self._context_dtype), "noise": noise})["codes"].long()
