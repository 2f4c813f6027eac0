"""The native fused frame: a whole frame of Chain(window) speculation -- or of AR decoding -- as ONE C call.

:class:`NativeChainFrame` decodes a frame exactly as :class:`rvqspec_lib.models.fused_spec.FusedChainFrame` does
(docs/methods.md#the-fused-speculative-round: the same rule, the same uniform order, the same inverse-CDF draws), but
the prefill and every round of draft -> verify -> accept -> commit run inside ONE C call, ``rvq_frame_run``, in
``rvqspec_lib/models/kernels/cpforward.c`` (its last section; a frame object made once by ``rvq_frame_new`` holds its
buffers, so a call allocates nothing), over the model and the packed per-depth heads of a
:class:`rvqspec_lib.models.native.NativeCodePredictor` (docs/precision.md#the-native-forward). A frame costs one call
from Python instead of one (or several) per round, so the per-round Python and operator overhead of
``decode_frame(..., backend=NativeCodePredictor(cp))`` is gone.

* ``window = 1`` is the **native AR frame**: 15 forward calls, no drafts; its uniforms are ``(B, n_codes, 1)`` and
  ``u[b, s, 0]`` draws code s+1 (``u[b, 0, 0]`` code 1): FusedChainFrame's layout with K = 0.
* ``window = N`` in 2..8 is Chain(N) with the reused heads as drafter; uniforms ``(B, n_codes, 2N - 1)``.

What the C frame computes differently from FusedChainFrame, none of which changes the codes' distribution: p is
computed lazily (only the verify heads whose acceptance test is reached, and the bonus head when it is used), and the
float32 warpers (temperature, top-k, softmax) are C loops, equal to torch's up to float32 rounding (the inverse CDF is
float64 as there). The greedy codes equal ``decode_frame(..., backend=NativeCodePredictor(cp))``'s code for code
(tests/test_native_frame.py), and the joint distribution of the codes passes the G-test against the exact AR pmf of
the native forward.

Embeddings. The code predictor embeds a code as ``small_to_mtp_projection(codec_embedding[j-1](code))``. The frame
precomputes the projected tables once (the official module applied to each whole table, in its precision, held as
float32: ``n_codes - 1`` tables of ``(V, H)``, 29 MB on the embedded model, 117 MB on the 1.7B; where the projection
is the identity and the tables are float32 already, as the embedded model's in float32 and int8-dynamic, they are the
module's own tensors, not copies) and looks codes up in C. A Linear projection (tiny-random, the 1.7B) therefore costs
nothing per code. The context is projected in Python, one frame at a time (torch's float32 Linear is not row invariant
across batch sizes; one frame at a time keeps a row's codes independent of the batch).

Rows of a batch are decoded one after the other inside the one C call, each with its own KV cache.
"""

from __future__ import annotations

import ctypes

import torch

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decoders import MAX_WINDOW
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.models.fused import fused_sampling
from rvqspec_lib.models.fused_spec import UniformFrame
from rvqspec_lib.models.kernels import cpforward as C
from rvqspec_lib.models.lean import ROPE_POSITIONS
from rvqspec_lib.models.native import NativeCodePredictor
#: Negative controls of the C frame (deliberately LOSSY rules, for tests only): accept every draft; draw drafts from
#: q re-warped to temperature 1.5 while acceptance is handed q; draw the code after a rejection from p, not the
#: residual.
FLAGS = {"always_accept": 1, "drafts_hot": 2, "residual_from_p": 4}

_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
#: ``cpforward.c``'s frame entry points: (argument types, result type).
_SIGNATURES = {
    "rvq_frame_new": ([_p, _p, _p, _p, _i, _i, _p, _p, _p, _i], _p),
    "rvq_frame_run": ([_p, _p, _p, _i, _f, _i, _i, _i, _p, _p], _i),
    "rvq_frame_free": ([_p], None),
}


def _lib():
    """The loaded library with the frame functions' argument types set (once)."""
    lib = C.lib()
    for name, (args, res) in _SIGNATURES.items():
        fn = getattr(lib, name)
        if fn.argtypes is None:
            fn.argtypes, fn.restype = args, res
    return lib


def _pointers(items) -> ctypes.Array:
    """A C array of ``void *`` (``None`` -> NULL)."""
    return (ctypes.c_void_p * len(items))(*items)


class NativeChainFrame(UniformFrame):
    """Chain(window) speculation, or AR with ``window=1``, one C call a frame (module docstring).

    Args:
        code_predictor: the official module (``model.talker.code_predictor``) on the CPU, in float32, bfloat16, int8
            or int8-dynamic (:func:`rvqspec_lib.models.precision.apply_precision`).
        window: 1 (the native AR frame) or 2..8 (the committed code plus window - 1 drafts, as
            :class:`rvqspec_lib.decoding.decoders.Chain`).
        sampling: the code predictor's sampling (default temperature 0.9, top-k 50); greedy is argmax.
        backend: a :class:`rvqspec_lib.models.native.NativeCodePredictor` over ``code_predictor`` to reuse (its C model
            and packed heads); ``None`` builds one.

    Attributes: ``window``, ``K`` (drafts per round, ``window - 1``), ``n_codes``, ``vocab``, ``u_width``
    (``2 K + 1``), ``backend``, ``tables`` (the projected embedding tables, float32 ``(V, H)`` each; ``tables[j-1]``
    embeds code j), ``last_calls`` (list: forward calls each row of the last frame took, the prefill included),
    ``name`` (``"native-ar"`` or ``"native-chain<N>"``).

    Raises:
        ValueError: a window outside 1..8; ``top_p < 1``; a backend over another module; what
            :class:`~rvqspec_lib.models.native.NativeCodePredictor` refuses (a module not on the CPU, another dtype,
            ...); a model whose RoPE table is shorter than a frame.
        RuntimeError: the C library cannot be built here (the reason, one line).
        MemoryError: the C frame object could not be allocated.

    The frame reads the backend's packed weights and its tables (shared with the module where no copy was needed,
    module docstring) for as long as it lives: build a new one after changing the module's weights.
    """

    def __init__(self, code_predictor, window: int = 4, sampling: Sampling | None = None, *, backend=None):
        if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"native frame window must be an integer in 1..{MAX_WINDOW} (1: the AR frame; N: the "
                             f"committed code plus N - 1 drafts), got {window!r}")
        self.sampling = fused_sampling(sampling, "native frame", f"decode_frame(decoder="
                                       f"{'AR()' if window == 1 else f'Chain({window})'}, backend=NativeCodePredictor(cp))")
        if backend is None:
            backend = NativeCodePredictor(code_predictor)
        elif not isinstance(backend, NativeCodePredictor) or backend.code_predictor is not code_predictor:
            raise ValueError("backend must be a NativeCodePredictor built over this code_predictor "
                             "(NativeCodePredictor(cp)), or None")
        self.code_predictor, self.backend = code_predictor, backend
        self.window, self.K, self.device = window, window - 1, torch.device("cpu")
        self.n_codes = P.n_codes(code_predictor)
        self.vocab = int(code_predictor.config.vocab_size)
        self.u_width = 2 * self.K + 1
        if self.n_codes + 1 > ROPE_POSITIONS:
            raise ValueError(f"a frame of {self.n_codes} codes needs {self.n_codes + 1} rotary positions, the native "
                             f"forward has {ROPE_POSITIONS}")
        self.dtype = P.param_dtype(code_predictor)
        self._talker_h = P.talker_hidden_size(code_predictor)
        proj = code_predictor.small_to_mtp_projection
        self._identity = isinstance(proj, torch.nn.Identity)
        with torch.inference_mode():
            self.tables = [proj(t.weight).to(torch.float32).contiguous()
                           for t in list(code_predictor.model.codec_embedding)[:max(self.n_codes - 1, 0)]]
        heads = backend.heads
        self._head_w = _pointers([C.ptr(h.data) for h in heads])
        self._head_s = _pointers([C.ptr(h.scale) for h in heads])
        self._head_c = _pointers([C.ptr(h.comp) for h in heads])
        self._emb = _pointers([C.ptr(t) for t in self.tables] or [None])
        s = self.sampling
        self._knobs = (1.0 if s.greedy else float(s.temperature), 0 if s.greedy else int(s.top_k), int(s.greedy))
        self._lib = _lib()
        self._frame = self._lib.rvq_frame_new(backend.handle, self._head_w, self._head_s, self._head_c, self.n_codes,
                                              self.vocab, self._emb, C.ptr(backend.cos), C.ptr(backend.sin), window)
        if not self._frame:
            raise MemoryError("the native frame could not allocate its buffers")
        self.last_calls: list[int] = []
        self.name = "native-ar" if window == 1 else f"native-chain{window}"

    def __del__(self):
        f = getattr(self, "_frame", None)
        if f:
            self._lib.rvq_frame_free(f)
            self._frame = None

    def project(self, context: torch.Tensor) -> torch.Tensor:
        """The projected context ``(B, 2, H)`` float32 (``small_to_mtp_projection`` in the module's dtype), one
        frame at a time (a row's values do not depend on the batch)."""
        x = context.to(self.dtype)
        if self._identity:
            return x.to(torch.float32).contiguous()
        proj = self.code_predictor.small_to_mtp_projection
        rows = [proj(x[i:i + 1]) for i in range(x.shape[0])] if x.shape[0] > 1 else [proj(x)]
        return torch.cat(rows).to(torch.float32).contiguous()

    def __call__(self, context: torch.Tensor, u: torch.Tensor, *, flags: int = 0) -> torch.Tensor:
        """Codes of ``B`` frames for given uniforms, in one C call.

        Args:
            context: ``(B, 2, talker_hidden)`` float (as :func:`rvqspec_lib.decoding.decode.decode_frame`'s).
            u: ``(B, n_codes, 2 K + 1)`` float64 in [0, 1) (:meth:`uniforms`).
            flags: 0; a negative control's bits (:data:`FLAGS`) in tests only: the codes are then NOT lossless.

        Returns:
            ``(B, n_codes)`` int64 codes 1..n_codes; :attr:`last_calls` gets each row's forward calls.

        Raises:
            ValueError: a context or uniforms of the wrong shape.
            MemoryError: the C frame could not allocate its scratch memory.
        """
        shape = context.shape if isinstance(context, torch.Tensor) else None
        if shape is None or len(shape) != 3 or shape[1] != 2 or shape[2] != self._talker_h or shape[0] < 1:
            got = tuple(shape) if shape is not None else type(context).__name__
            raise ValueError(f"context must have shape (B, 2, {self._talker_h}) = [talker hidden, embedding of code "
                             f"0], got {got}")
        b = shape[0]
        if not isinstance(u, torch.Tensor) or u.shape != (b, self.n_codes, self.u_width):
            got = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
            raise ValueError(f"uniforms must have shape {(b, self.n_codes, self.u_width)} (NativeChainFrame.uniforms), "
                             f"got {got}")
        if self._identity and self.dtype is torch.float32 and context.dtype is torch.float32 \
                and context.is_contiguous() and context.is_cpu:
            ctx = context  # a float32 module whose projection is the identity: the context as it is (cheap)
        else:
            with torch.inference_mode():
                ctx = self.project(context)
        if u.dtype is not torch.float64 or not u.is_contiguous() or not u.is_cpu:
            u = u.detach().to(torch.float64).contiguous().cpu()
        codes = torch.empty(b, self.n_codes, dtype=torch.int64)
        calls = torch.empty(b, dtype=torch.int32)
        rc = self._lib.rvq_frame_run(self._frame, ctx.data_ptr(), u.data_ptr(), b, *self._knobs, flags,
                                     codes.data_ptr(), calls.data_ptr())
        if rc:
            if rc == -1:
                raise MemoryError("the native frame could not allocate its scratch memory")
            raise ValueError(f"the native frame refused its arguments (code {rc})")
        self.last_calls = calls.tolist()
        return codes

    def compile_all(self, batch: int = 1) -> float:
        """Nothing to compile (the C library is built once, on first use): 0.0 seconds."""
        return 0.0

    def __repr__(self) -> str:
        return f"NativeChainFrame(window={self.window}, precision={self.backend.precision!r}, sampling={self.sampling})"
