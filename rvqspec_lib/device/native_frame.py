"""The native fused frame: a whole frame of Chain(window) speculation, or of AR (``window=1``), as ONE C call,
``rvq_frame_run`` in ``kernels/cpforward.c``, over a :class:`rvqspec_lib.device.native.NativeCodePredictor`: the
rules and uniform order of ``FusedChainFrame`` (docs/methods.md#the-fused-speculative-round, its last item).

The embedding tables are projected once (``small_to_mtp_projection(codec_embedding[j-1])``, held as float32; the
module's own tensors where the projection is the identity in float32) and looked up in C. The context is projected
one frame at a time (torch's float32 Linear is not row invariant across batch sizes).
"""

from __future__ import annotations

import ctypes

import torch

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.decoders import MAX_WINDOW
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.device.fused import fused_sampling
from rvqspec_lib.device.fused_spec import UniformFrame
from rvqspec_lib.device.kernels import cpforward as C
from rvqspec_lib.device.lean import ROPE_POSITIONS
from rvqspec_lib.device.native import NativeCodePredictor
#: Negative controls of the C frame (deliberately LOSSY rules, for tests only): accept every draft; draw drafts from
#: q re-warped to temperature 1.5 while acceptance is handed q; draw the code after a rejection from p, not the
#: residual.
FLAGS = {"always_accept": 1, "drafts_hot": 2, "residual_from_p": 4}


def _pointers(items) -> ctypes.Array:
    """A C array of ``void *`` (``None`` -> NULL)."""
    return (ctypes.c_void_p * len(items))(*items)


class NativeChainFrame(UniformFrame):
    """Chain(window) speculation, or AR with ``window=1``, one C call a frame (module docstring), over the packed
    weights of ``backend`` (``verify_backend("native", cp)``) as long as it lives.

    Args:
        backend: the ``NativeCodePredictor``. window: 1 (AR) or 2..8. sampling: default the checkpoints'.

    Attributes: ``K`` (``window - 1``), ``tables`` (float32 ``(V, H)``; ``tables[j-1]`` embeds code j; the
    backend's, shared: :meth:`NativeCodePredictor.frame_tables`),
    ``last_calls`` (forward calls per row of the last frame, the prefill included).

    Raises:
        ValueError: a window outside 1..8; ``top_p < 1``; a frame longer than the RoPE table.
        MemoryError: the C frame could not be allocated.
    """

    def __init__(self, backend: NativeCodePredictor, window: int = 4, sampling: Sampling | None = None):
        if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"native frame window must be an integer in 1..{MAX_WINDOW} (1: the AR frame; N: the "
                             f"committed code plus N - 1 drafts), got {window!r}")
        decoder = "AR()" if window == 1 else f"Chain({window})"
        self.sampling = fused_sampling(sampling, "native frame",
                                       f"decode_frame(decoder={decoder}, backend=verify_backend('native', cp))")
        code_predictor = self.code_predictor = backend.code_predictor
        self.backend = backend
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
        self.tables = backend.frame_tables()  # shared by every frame over this backend
        heads = backend.heads
        self._head_w = _pointers([C.ptr(h.data) for h in heads])
        self._head_s = _pointers([C.ptr(h.scale) for h in heads])
        self._head_c = _pointers([C.ptr(h.comp) for h in heads])
        self._emb = _pointers([C.ptr(t) for t in self.tables] or [None])
        s = self.sampling
        self._knobs = (1.0 if s.greedy else float(s.temperature), 0 if s.greedy else int(s.top_k), int(s.greedy))
        self._lib = C.lib()
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
        """The projected context ``(B, 2, H)`` float32, one frame at a time (module docstring)."""
        x = context.to(self.dtype)
        if self._identity:
            return x.to(torch.float32).contiguous()
        proj = self.code_predictor.small_to_mtp_projection
        rows = [proj(x[i:i + 1]) for i in range(x.shape[0])] if x.shape[0] > 1 else [proj(x)]
        return torch.cat(rows).to(torch.float32).contiguous()

    def __call__(self, context: torch.Tensor, u: torch.Tensor, *, flags: int = 0) -> torch.Tensor:
        """``(B, n_codes)`` int64 codes of ``B`` frames from ``context`` ``(B, 2, talker_hidden)`` and uniforms ``u``
        ``(B, n_codes, 2 K + 1)`` float64, in one C call; ``flags``: a negative control's bits (:data:`FLAGS`, tests
        only: the codes are then NOT lossless).

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
