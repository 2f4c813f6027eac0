"""The fused speculative chain through ONNX Runtime: one exported graph per start depth, run on the CPU.

:class:`~rvqspec_lib.models.fused_spec.FusedChainFrame` already writes a round as a pure tensor function of fixed
shapes for a given start depth s (docs/methods.md#the-fused-speculative-round). Here each of those functions becomes
an ONNX file (``torch.onnx.export``, the ``torch.export`` path, as :func:`rvqspec_lib.models.export_formats.export_onnx`
exports the other graphs), with the KV cache as explicit inputs returned updated:

* :class:`PrefillGraph`: ``(context, u) -> (codes, h, k, v)``, the frame's first call;
* :class:`RoundGraph` (one per s = 1..n_codes-1): ``(codes, h, k, v, u) -> (codes, committed, h, k, v)``, draft ->
  verify -> accept -> commit of :meth:`FusedChainFrame.round`, arithmetic unchanged (the round's in-place cache writes
  go to copies of the inputs, so the graph is a pure function); the same for the point-mass tree round of
  :class:`~rvqspec_lib.models.fused_tree.FusedTreeFrame` (``tree=``), whose cache compaction is a gather inside the
  graph.

:class:`OrtFusedChainFrame` runs a frame through those files with the interface of ``FusedChainFrame``
(``uniforms``, ``__call__(context, u)``, ``decode``, ``last_calls``, ``compile_all``), so that
:func:`rvqspec_lib.eval.speed.time_frames` times it as a ``fused-chain{window}`` condition. The uniforms are the
same tensor in the same order (:meth:`FusedChainFrame.uniforms`): the same seed gives the eager frame's codes
(tests/test_fused_spec_export.py). The one host read per round is the committed count (which file runs next). A batch
is decoded row by row (a row's codes depend on its own uniforms only, so this changes no code); the files are batch 1.

Scope: float32 graphs (the precisions of :mod:`rvqspec_lib.models.precision` other than float32 are the compiled and
eager paths' business: ONNX Runtime's CPU kernels have no bfloat16 matmul, and its int8 path is its own quantiser, not
:class:`~rvqspec_lib.models.precision.Int8Linear`'s arithmetic); the torch matmul (not mgemv).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rvqspec_lib.models import export_formats as F
from rvqspec_lib.models.fused_spec import FusedChainFrame
from rvqspec_lib.models.fused_tree import FusedTreeFrame
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.sampling import Sampling, or_fresh_generator


class PrefillGraph(nn.Module):
    """:meth:`FusedChainFrame.prefill` as a module for export (batch and shapes fixed by ``frame``).

    Inputs: ``context`` ``(B, 2, talker_hidden)`` float32; ``u`` ``(B, n_codes, u_width)`` float64.
    Outputs: ``codes`` ``(B, n_codes)`` int64 (code 1 in column 0), ``h`` ``(B, H)`` float32, ``k`` and ``v``
    ``(layers, B, kv_heads, n_codes + 1, head_dim)`` float32."""

    def __init__(self, frame: FusedChainFrame):
        super().__init__()
        self.cp = frame.code_predictor  # registered so that export finds the parameters the frame reads
        self.frame = frame

    def forward(self, context, u):
        return self.frame.prefill(context, u)


class RoundGraph(nn.Module):
    """:meth:`FusedChainFrame.round` of one start depth ``s`` as a pure module for export.

    Inputs: ``codes`` ``(B, n_codes)`` int64, ``h`` ``(B, H)``, ``k``, ``v`` (as :class:`PrefillGraph`'s outputs),
    ``u`` ``(B, n_codes, u_width)`` float64 (the frame's uniforms). Outputs: ``codes``, ``committed`` ``(B,)`` int64 (codes added, 1..window),
    ``h`` (the last accepted node's hidden state), ``k_out``, ``v_out`` (the caches with the round's slots written).
    """

    def __init__(self, frame: FusedChainFrame, s: int):
        super().__init__()
        if not 1 <= int(s) < frame.n_codes:
            raise ValueError(f"start depth must be in 1..{frame.n_codes - 1}, got {s}")
        self.cp = frame.code_predictor
        self.frame, self.s = frame, int(s)

    def forward(self, codes, h, k, v, u):
        k, v = k.clone(), v.clone()  # the round writes its slots in place: into copies, so the graph is pure
        codes, committed, h = self.frame.round(self.s, codes, h, k, v, u)
        return codes, committed, h, k, v


_ROUND_IN = ("codes", "h", "k", "v", "u")
_ROUND_OUT = ("codes_out", "committed", "h_out", "k_out", "v_out")


def _export(module: nn.Module, args: tuple, path: Path, inputs, outputs) -> Path:
    def write(tmp: Path) -> None:
        with F._quiet():
            torch.onnx.export(module, args, str(tmp), dynamo=True, input_names=list(inputs),
                              output_names=list(outputs), opset_version=F.ONNX_OPSET, external_data=False,
                              verbose=False, report=False, optimize=False)
    F._write_atomically(Path(path), write)
    return Path(path)


def _eager_frame(code_predictor, window: int, sampling, tree):
    if P.param_dtype(code_predictor) != torch.float32:
        raise ValueError(f"the ONNX fused {'tree' if tree is not None else 'chain'} is exported in float32; this code "
                         f"predictor is {P.param_dtype(code_predictor)}: use --dtype float32 with --backend onnx, or "
                         f"--backend compile for other precisions")
    if tree is not None:
        return FusedTreeFrame(code_predictor, tree, sampling, compile=False)
    return FusedChainFrame(code_predictor, window, sampling, compile=False)


def export_fused_chain(code_predictor, folder, *, window: int = 4, sampling: Sampling | None = None,
                       tree=None) -> dict:
    """Write the prefill graph and the round graph of every start depth of ``FusedChainFrame(window)`` (or, with
    ``tree``, of ``FusedTreeFrame(tree)``) to ``folder``: batch 1, float32.

    Args:
        code_predictor: the official module in float32. folder: created if absent. window, sampling: as
            :class:`FusedChainFrame`. tree: a point-mass tree (:class:`~rvqspec_lib.models.fused_tree.FusedTreeFrame`)
            instead of the chain.

    Returns:
        ``{"prefill": path, 1: path, ..., n_codes - 1: path}`` (files ``<frame name>-prefill.onnx`` and
        ``<frame name>-s{s}.onnx``, e.g. ``fused-chain4-s1.onnx``).

    Raises:
        ValueError: a module not in float32 (one line naming the fix), what the frame classes refuse.
    """
    frame = _eager_frame(code_predictor, window, sampling, tree)
    stem = frame.name
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ctx = torch.zeros(1, 2, P.talker_hidden_size(code_predictor))
    u = frame.uniforms(1, torch.Generator().manual_seed(0))
    paths = {}
    with torch.no_grad():
        codes, h, k, v = frame.prefill(ctx, u)
        paths["prefill"] = _export(PrefillGraph(frame).eval(), (ctx, u), folder / f"{stem}-prefill.onnx",
                                   ("context", "u"), ("codes", "h", "k", "v"))
        for s in range(1, frame.n_codes):
            args = (codes, h.contiguous(), k, v, u)
            paths[s] = _export(RoundGraph(frame, s).eval(), args, folder / f"{stem}-s{s}.onnx",
                               _ROUND_IN, _ROUND_OUT)
    return paths


class OrtFusedChainFrame(F._WorkFolder):
    """The fused speculative chain through ONNX Runtime on the CPU (module docstring): the interface of
    :class:`FusedChainFrame`.

    Args:
        code_predictor: the official module in float32. window, sampling: as :class:`FusedChainFrame`. tree: a
            point-mass tree: the fused tree round instead (:class:`~rvqspec_lib.models.fused_tree.FusedTreeFrame`).
        threads: ONNX Runtime intra-op threads (default torch's). work_dir: where the files go (a temporary folder
            removed with this object by default). paths: files written by :func:`export_fused_chain` to use instead.

    Raises:
        ValueError: as :func:`export_fused_chain`.
    """

    def __init__(self, code_predictor, window: int = 4, sampling: Sampling | None = None, *,
                 threads: int | None = None, work_dir=None, paths: dict | None = None, tree=None):
        self._ref = _eager_frame(code_predictor, window, sampling, tree)  # checks window, tree, sampling, dtype
        self.code_predictor = code_predictor
        self.window, self.K, self.n_codes = self._ref.window, self._ref.K, self._ref.n_codes
        self.u_width = self._ref.u_width
        for attr in ("nodes", "decoder_label"):  # a tree frame's row label (rvqspec_lib.eval.speed.time_frames)
            if hasattr(self._ref, attr):
                setattr(self, attr, getattr(self._ref, attr))
        t0 = time.perf_counter()
        if paths is None:
            paths = export_fused_chain(code_predictor, self._work_folder(work_dir), window=window, sampling=sampling,
                                       tree=tree)
        self.export_s = time.perf_counter() - t0
        self.paths = paths
        self._threads = threads
        self._sessions: dict = {}
        self.compile_s: dict = {}  # session creation seconds per graph (ONNX Runtime's graph optimisation)
        self.last_calls: list[int] = []
        self.name = f"{self._ref.name}-onnxruntime"

    def _session(self, key):
        sess = self._sessions.get(key)
        if sess is None:
            t0 = time.perf_counter()
            sess = self._sessions[key] = F.ort_session(self.paths[key], threads=self._threads)
            self.compile_s[key] = time.perf_counter() - t0
        return sess

    def compile_all(self, batch: int = 1) -> float:
        """Open every graph's ONNX Runtime session now (its graph optimisation is not timed in a frame). ``batch``
        is accepted for :class:`FusedChainFrame`'s signature (the files are batch 1). Returns the seconds taken."""
        t0 = time.perf_counter()
        for key in self.paths:
            self._session(key)
        return time.perf_counter() - t0

    def uniforms(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """As :meth:`FusedChainFrame.uniforms` (the same draws in the same order)."""
        return self._ref.uniforms(batch, generator)

    def _row(self, context: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, int]:
        codes, h, k, v = self._session("prefill").run(None, {"context": context, "u": u})
        s, calls = 1, 1
        while s < self.n_codes:  # one host read per round: the committed count
            codes, com, h, k, v = self._session(s).run(None, {"codes": codes, "h": h, "k": k, "v": v, "u": u})
            s += int(com[0])
            calls += 1
        return codes, calls

    def __call__(self, context: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Codes ``(B, n_codes)`` int64 for given uniforms ``(B, n_codes, u_width)`` float64 (rows one by one).

        Raises:
            ValueError: uniforms of the wrong shape."""
        b = context.shape[0]
        want = (b, self.n_codes, self.u_width)
        if tuple(u.shape) != want:
            raise ValueError(f"uniforms must have shape {want} ({type(self._ref).__name__}.uniforms), got "
                             f"{tuple(u.shape)}")
        ctx = context.detach().to(torch.float32).cpu().numpy()
        un = u.detach().to(torch.float64).cpu().numpy()
        out, self.last_calls = [], []
        for i in range(b):
            codes, calls = self._row(ctx[i:i + 1], un[i:i + 1])
            out.append(torch.from_numpy(codes))
            self.last_calls.append(calls)
        return torch.cat(out).long()

    def decode(self, context: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """As :meth:`FusedChainFrame.decode`."""
        generator = or_fresh_generator(generator, context.device)
        return self(context, self.uniforms(context.shape[0], generator))
