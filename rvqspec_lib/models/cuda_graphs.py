"""Verify calls and whole frames replayed as captured CUDA graphs (the GPU leg of the timing harness).

On a GPU the code predictor's calls are short and launch-bound: vllm-omni's eager code predictor takes 86 ms of an
88 ms talker step and CUDA graphs bring it to 6.5 ms a frame; faster-qwen3-tts captures the whole 15-step inner loop
as one graph (docs/methods.md#headline-numbers-reported-by-others). Two pieces, over the lean forward
(:mod:`rvqspec_lib.models.lean`, the official parameters in place):

* :class:`GraphedBackend`: the verify backend protocol of :mod:`rvqspec_lib.decoding.predictor` with every verify call
  of a given shape ``(B, Q, slots)`` captured once and replayed (every call of a decoder has one shape: the slot
  cache of :func:`rvqspec_lib.decoding.decode.decode_frame`). Captured graphs write into fixed addresses, so the cache of
  a shape is ONE static pair of tensors reused frame after frame (zeroed by ``new_cache``) and compacted in place;
  a backend decodes one frame at a time.
* :class:`GraphedFrame`: :meth:`rvqspec_lib.models.fused.FusedARFrame.frame` captured per batch size.

``use_graphs=False`` runs the same static-buffer logic eagerly (any device): what tests check on the CPU, since
capture and replay need CUDA.
"""

from __future__ import annotations

import time

import torch

from rvqspec_lib.models.fused import FusedARFrame
from rvqspec_lib.models.lean import LeanCache, LeanCodePredictor

#: Eager calls on a side stream before a capture (allocator and kernel autotuning settle first).
CAPTURE_WARMUP = 2


def _check_graphs(device: torch.device, use_graphs: bool | None) -> bool:
    if use_graphs is None:
        return device.type == "cuda"
    if use_graphs and device.type != "cuda":
        raise ValueError(f"CUDA graphs need the model on a CUDA device, it is on {device}: load it with "
                         "device='cuda' or pass use_graphs=False")
    return bool(use_graphs)


def _capture(fn, warmup: int = CAPTURE_WARMUP):
    """Capture ``fn()`` (over static inputs) as a CUDA graph after ``warmup`` eager calls on a side stream;
    returns ``(graph, output)``: replaying the graph refreshes ``output`` in place."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


class GraphedBackend:
    """The verify backend protocol, every call shape captured once as a CUDA graph and replayed.

    Args:
        code_predictor: the official module on the GPU (parameters read in place).
        use_graphs: capture and replay (default: when the module is on CUDA). ``False``: the same static caches and
            input buffers, run eagerly (a CPU check of everything but the capture).
        matmul: the lean forward's ``matmul`` (``"torch"`` on a GPU).

    Attributes:
        capture_s: ``{(B, Q, slots): seconds}`` spent capturing each shape (warm-up included).

    Raises:
        ValueError: ``use_graphs=True`` off CUDA; what :class:`~rvqspec_lib.models.lean.LeanCodePredictor` refuses.
    """

    def __init__(self, code_predictor, *, use_graphs: bool | None = None, matmul: str = "torch"):
        self.lean = LeanCodePredictor(code_predictor, matmul=matmul)
        self.code_predictor = code_predictor
        self.use_graphs = _check_graphs(self.lean.device, use_graphs)
        self._caches: dict[tuple, LeanCache] = {}
        self._graphs: dict[tuple, tuple] = {}
        self.capture_s: dict[tuple, float] = {}
        self.name = "cuda-graphs" if self.use_graphs else "static-eager"

    def new_cache(self, batch: int, slots: int) -> LeanCache:
        """THE cache of ``(batch, slots)``: allocated once, zeroed for each new frame (captured graphs write into
        its addresses)."""
        key = (int(batch), int(slots))
        with torch.inference_mode():  # every static tensor lives in inference mode (decode_frame runs there)
            cache = self._caches.get(key)
            if cache is None:
                cache = self._caches[key] = self.lean.new_cache(batch, slots)
            else:
                cache.k.zero_()
                cache.v.zero_()
        return cache

    def forward(self, embeds, positions, allow, cache: LeanCache, write_slots):
        """The verify call (arguments and result as :func:`rvqspec_lib.decoding.predictor.verify_forward`): inputs
        copied into the shape's static buffers, the graph replayed, a copy of its output returned."""
        with torch.inference_mode():
            return self._forward(embeds, positions, allow, cache, write_slots)

    def _forward(self, embeds, positions, allow, cache: LeanCache, write_slots):
        b, q = embeds.shape[:2]
        key = (int(b), int(q), cache.n_slots)
        if self._caches.get(key[::2]) is not cache:
            raise ValueError("GraphedBackend needs the cache its own new_cache returned (one frame at a time)")
        entry = self._graphs.get(key)
        if entry is None:
            t0 = time.perf_counter()
            static = {"embeds": embeds.clone(), "positions": positions.clone(), "allow": allow.clone(),
                      "write": write_slots.clone()}

            def call():
                return self.lean.forward(static["embeds"], static["positions"], static["allow"], cache,
                                         static["write"])
            if self.use_graphs:
                graph, out = _capture(call)
            else:
                graph, out = None, None
            entry = self._graphs[key] = (graph, static, out, call)
            self.capture_s[key] = time.perf_counter() - t0
        graph, static, out, call = entry
        static["embeds"].copy_(embeds)
        static["positions"].copy_(positions)
        static["allow"].copy_(allow)
        static["write"].copy_(write_slots)
        if graph is None:
            return call()
        graph.replay()
        return out.clone()  # the next replay overwrites the static output

    def compact(self, cache: LeanCache, order: torch.Tensor) -> None:
        """Reorder slots IN PLACE (the captured graphs keep the cache's addresses)."""
        with torch.inference_mode():
            if order.shape[0] == 1:
                cache.k.copy_(cache.k.index_select(3, order[0]))
                cache.v.copy_(cache.v.index_select(3, order[0]))
                return
            idx = order[None, :, None, :, None].expand_as(cache.k)
            cache.k.copy_(cache.k.gather(3, idx))
            cache.v.copy_(cache.v.gather(3, idx))

    def embed(self, codes, depth):
        return self.lean.embed(codes, depth)

    def logits(self, hidden, head):
        return self.lean.logits(hidden, head)

    def __repr__(self) -> str:
        return f"GraphedBackend(use_graphs={self.use_graphs})"


class GraphedFrame:
    """The fused AR frame captured as one CUDA graph per batch size: the interface of
    :class:`~rvqspec_lib.models.fused.FusedARFrame` (``noise``, ``__call__``, ``decode``).

    Args:
        code_predictor: the official module on the GPU. sampling: as :class:`FusedARFrame`.
        use_graphs: as :class:`GraphedBackend`.
    """

    def __init__(self, code_predictor, sampling=None, *, use_graphs: bool | None = None):
        self.fused = FusedARFrame(code_predictor, sampling, compile=False)
        self.use_graphs = _check_graphs(self.fused.lean.device, use_graphs)
        self.n_codes, self.vocab = self.fused.n_codes, self.fused.vocab
        self._graphs: dict[int, tuple] = {}
        self.compile_s: dict[int, float] = {}  # capture seconds per batch size (time_frames reports compile_s)
        self.name = "fused-AR-" + ("cuda-graph" if self.use_graphs else "static-eager")

    def noise(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """As :meth:`FusedARFrame.noise` (on the model's device)."""
        return self.fused.noise(batch, generator)

    def __call__(self, context: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Codes ``(B, n_codes)`` int64 for given noise."""
        with torch.inference_mode():
            b = int(context.shape[0])
            entry = self._graphs.get(b)
            if entry is None:
                t0 = time.perf_counter()
                static = {"context": context.clone(), "noise": noise.clone()}

                def call():
                    return self.fused.frame(static["context"], static["noise"])
                graph, out = _capture(call) if self.use_graphs else (None, None)
                entry = self._graphs[b] = (graph, static, out, call)
                self.compile_s[b] = time.perf_counter() - t0
            graph, static, out, call = entry
            static["context"].copy_(context)
            static["noise"].copy_(noise)
            if graph is None:
                return call()
            graph.replay()
            return out.clone()

    def decode(self, context: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """As :meth:`FusedARFrame.decode`."""
        if generator is None:
            generator = torch.Generator(device=context.device)
            generator.seed()
        return self(context, self.noise(context.shape[0], generator))
