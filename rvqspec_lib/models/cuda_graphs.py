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
* :class:`GraphedChainFrame`: the fused speculative chain (:class:`rvqspec_lib.models.fused_spec.FusedChainFrame`,
  docs/methods.md#the-fused-speculative-round) with its prefill and the round of every start depth s captured as one
  graph each, per batch size, over ONE set of static buffers (context, uniforms, codes, H, KV cache, depth); the one
  host read per round is the rows' new depth (which graph is next, or done).

``use_graphs=False`` runs the same static-buffer logic eagerly (any device): what tests check on the CPU, since
capture and replay need CUDA. For :class:`GraphedChainFrame` it goes further: the graphs are stand-ins
(:class:`EagerGraph`) built the way a capture builds them (warm-up calls first) and replayed through the same loop,
so only ``torch.cuda.graph`` itself is left to a GPU.
"""

from __future__ import annotations

import time

import torch

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.sampling import or_fresh_generator
from rvqspec_lib.models.fused import FusedARFrame
from rvqspec_lib.models.fused_spec import FusedChainFrame
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


class EagerGraph:
    """A stand-in for a captured graph off CUDA: built as :func:`_capture` builds one (``warmup`` eager calls of
    ``fn`` first, which write into the same static buffers), and ``replay()`` calls ``fn`` eagerly. The static-buffer
    logic around a graph is then the same on any device.

    Args:
        fn: a function of no arguments over static buffers. warmup: calls made now (default :data:`CAPTURE_WARMUP`).
    """

    def __init__(self, fn, warmup: int = CAPTURE_WARMUP):
        self.fn = fn
        for _ in range(warmup):
            fn()

    def replay(self) -> None:
        """Run ``fn`` once (what replaying a captured graph does)."""
        self.fn()


class GraphedChainFrame:
    """The fused speculative chain with the prefill and every round captured as CUDA graphs (see the module
    docstring): the interface of :class:`~rvqspec_lib.models.fused_spec.FusedChainFrame` (``uniforms``,
    ``__call__``, ``decode``, ``last_calls``, ``compile_all``, ``compile_s``), the same codes for the same uniforms.

    Per batch size B the static buffers are ``context`` ``(B, 2, talker_hidden)``, ``u`` ``(B, n_codes, 2K+1)``
    float64 (the frame's uniforms, drawn up front: a static INPUT of every graph), ``codes`` ``(B, n_codes)`` int64,
    ``h`` ``(B, H)``, ``k`` and ``v`` (the frame's KV cache, ``(layers, B, kv_heads, n_codes + 1, head_dim)``),
    ``committed`` and ``depth`` ``(B,)`` int64. The prefill graph fills codes, h, k, v from context and u and sets
    depth to 1; the graph of start depth s runs :meth:`FusedChainFrame.round` on the buffers and writes its results
    back into them (depth += committed). A frame is: copy context and u in, replay the prefill, then per round read
    ``depth`` once on the host and replay graph ``depth`` (rows at different depths: each depth's rows gathered into
    the buffers of their own batch size, replayed, scattered back, as :class:`FusedChainFrame` does).

    Every graph of a batch size is captured the first time that batch size is seen (or by :meth:`compile_all`),
    before its buffers hold a frame: a capture's warm-up calls write into the buffers.

    Args:
        code_predictor: the official module (on the GPU for graphs). window: the Chain window, 2..8.
        sampling: as :class:`FusedChainFrame` (temperature and top-k; ``top_p < 1`` refused).
        use_graphs: as :class:`GraphedBackend` (``False``: :class:`EagerGraph` stand-ins, any device).

    Raises:
        ValueError: ``use_graphs=True`` off CUDA; what :class:`FusedChainFrame` refuses (window, ``top_p``).
    """

    def __init__(self, code_predictor, window: int = 4, sampling=None, *, use_graphs: bool | None = None):
        self.fused = FusedChainFrame(code_predictor, window, sampling, compile=False)
        self.use_graphs = _check_graphs(self.fused.lean.device, use_graphs)
        self.code_predictor = code_predictor
        self.window, self.K, self.n_codes = self.fused.window, self.fused.K, self.fused.n_codes
        self.u_width = self.fused.u_width
        self.nodes = self.window  # query positions of one verify call (time_frames' ``nodes``)
        self._buffers: dict[int, dict] = {}
        self._graphs: dict[tuple, object] = {}  # ("prefill", B) or (s, B) -> graph
        self.compile_s: dict[int, float] = {}  # capture seconds per batch size (every graph of it)
        self.last_calls: list[int] = []  # calls (prefill + rounds) each row of the last frame took
        self.name = f"fused-chain{window}-" + ("cuda-graph" if self.use_graphs else "static-eager")

    def uniforms(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """As :meth:`FusedChainFrame.uniforms`: ``(B, n_codes, 2K+1)`` float64 on the model's device."""
        return self.fused.uniforms(batch, generator)

    def buffers(self, batch: int) -> dict:
        """The static buffers of ``batch`` rows (class docstring), every graph of that batch size captured first."""
        if batch not in self._buffers:
            self._build(int(batch))
        return self._buffers[batch]

    def _build(self, b: int) -> None:
        fused, lean = self.fused, self.fused.lean
        t0 = time.perf_counter()
        with torch.inference_mode():
            ctx = torch.zeros(b, 2, P.talker_hidden_size(self.code_predictor), dtype=lean.dtype, device=lean.device)
            u = torch.zeros(b, self.n_codes, self.u_width, dtype=torch.float64, device=lean.device)
            codes, h, k, v = fused.prefill(ctx, u)  # the shapes and dtypes of the buffers
            buf = {"context": ctx, "u": u, "codes": codes.clone(), "h": h.contiguous().clone(), "k": k.clone(),
                   "v": v.clone(), "committed": torch.zeros(b, dtype=torch.int64, device=lean.device),
                   "depth": torch.ones(b, dtype=torch.int64, device=lean.device)}
            self._buffers[b] = buf
            make = _capture if self.use_graphs else (lambda fn: (EagerGraph(fn), None))
            self._graphs[("prefill", b)] = make(lambda: self._prefill_into(buf))[0]
            for s in range(1, self.n_codes):
                self._graphs[(s, b)] = make(lambda s=s: self._round_into(s, buf))[0]
        self.compile_s[b] = time.perf_counter() - t0

    def _prefill_into(self, buf: dict) -> None:
        """What the prefill graph runs: :meth:`FusedChainFrame.prefill` on the static context and uniforms, its
        results copied into the static buffers."""
        codes, h, k, v = self.fused.prefill(buf["context"], buf["u"])
        buf["codes"].copy_(codes)
        buf["h"].copy_(h)
        buf["k"].copy_(k)
        buf["v"].copy_(v)
        buf["committed"].fill_(1)
        buf["depth"].fill_(1)

    def _round_into(self, s: int, buf: dict) -> None:
        """What the graph of start depth ``s`` runs: :meth:`FusedChainFrame.round` on the static buffers (the KV
        cache written in place), its results copied back, the depth advanced."""
        codes, committed, h = self.fused.round(s, buf["codes"], buf["h"], buf["k"], buf["v"], buf["u"])
        buf["codes"].copy_(codes)
        buf["h"].copy_(h)
        buf["committed"].copy_(committed)
        buf["depth"].add_(committed)

    def compile_all(self, batch: int = 1) -> float:
        """Capture the prefill and the round of every start depth for ``batch`` rows now (a benchmark must not
        capture inside a timed frame). Returns the seconds taken (0 when they already exist)."""
        if batch in self._buffers:
            return 0.0
        self.buffers(batch)
        return self.compile_s[batch]

    def __call__(self, context: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Codes of ``B`` frames for given uniforms: the codes :class:`FusedChainFrame` gives for them.

        Args:
            context: ``(B, 2, talker_hidden)``. u: ``(B, n_codes, 2K+1)`` float64 (:meth:`uniforms`).

        Returns:
            ``(B, n_codes)`` int64 codes 1..n_codes (a copy: the next frame overwrites the static buffers).

        Raises:
            ValueError: uniforms of the wrong shape.
        """
        b = int(context.shape[0])
        want = (b, self.n_codes, self.u_width)
        if tuple(u.shape) != want:
            raise ValueError(f"uniforms must have shape {want} ({type(self).__name__}.uniforms), got {tuple(u.shape)}")
        with torch.inference_mode():
            buf = self.buffers(b)
            buf["context"].copy_(context)
            buf["u"].copy_(u)
            self._graphs[("prefill", b)].replay()
            calls = [1] * b
            while True:
                depth = buf["depth"].tolist()  # the one host read per round
                active = sorted({d for d in depth if d < self.n_codes})
                if not active:
                    self.last_calls = calls
                    return buf["codes"].clone()
                calls = [c + (d < self.n_codes) for c, d in zip(calls, depth)]
                if len(active) == 1 and len(set(depth)) == 1:
                    self._graphs[(active[0], b)].replay()
                    continue
                for d in active:  # rows at different depths: one replay per depth, on those rows
                    self._replay_rows(d, [i for i, x in enumerate(depth) if x == d], buf)

    def _replay_rows(self, s: int, rows: list[int], buf: dict) -> None:
        """Round ``s`` on some rows of ``buf``: gathered into the buffers of ``len(rows)`` rows, replayed there,
        scattered back."""
        idx = torch.tensor(rows, device=buf["codes"].device)
        sub = self.buffers(len(rows))
        for name in ("codes", "h", "u", "depth", "committed"):
            sub[name].copy_(buf[name][idx])
        for name in ("k", "v"):  # (layers, B, ...): rows on dim 1
            sub[name].copy_(buf[name][:, idx])
        self._graphs[(s, len(rows))].replay()
        for name in ("codes", "h", "depth", "committed"):
            buf[name][idx] = sub[name]
        for name in ("k", "v"):
            buf[name][:, idx] = sub[name]

    def decode(self, context: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Uniforms from ``generator`` (fresh unseeded when ``None``; never the global RNG), then the frame:
        ``(B, n_codes)`` int64."""
        generator = or_fresh_generator(generator, context.device)
        return self(context, self.uniforms(context.shape[0], generator))

    def __repr__(self) -> str:
        return f"GraphedChainFrame(window={self.window}, use_graphs={self.use_graphs})"
