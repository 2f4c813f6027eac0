"""The code predictor as three fixed-shape graphs over the OFFICIAL weights that ``torch.export`` takes whole
(:mod:`rvqspec_lib.device.export_formats` writes them): :class:`SteppedGraph` (TTSKit's stepped MultiCodeDecoder),
:class:`VerifyGraph` (the paper's fused verify call, §2.2) and :class:`FrameGraph` (a whole fused frame).

The layers are the lean forward's (:mod:`rvqspec_lib.device.lean`). Departures for export, each exact in float32:
0/1 float masks turned into an additive :data:`MASK_MIN`; int32 integer inputs (Core ML's); the cache as inputs
returned updated (ONNX) or float16 buffers updated in place (Core ML states); keys cached after RoPE, so a round's
N positions go to any free slots, no compaction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rvqspec_lib.device.fused import FusedARFrame
from rvqspec_lib.device.lean import ROPE_POSITIONS, LeanStack
from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.decoding.trees import DraftTree

#: The three graphs, by the names the command line uses.
GRAPHS = ("stepped", "verify", "frame")
#: Node budgets N (query positions of one verify call, the root included) a fused verify graph may have.
MIN_NODES, MAX_NODES = 2, 64
#: Additive mask value of a masked slot: exp(MASK_MIN - max) is exactly 0 in float32 and float16, and it stays
#: finite in float16 (finfo(float32).min would become -inf there, and 0 * -inf is NaN).
MASK_MIN = -30000.0
#: Ways to hold the KV cache: explicit inputs/outputs (ONNX), or buffers mutated in place (Core ML states).
STATES = ("inputs", "buffers")
#: dtype of a cache held in buffers: Core ML states are float16 only (coremltools 9 refuses float32 states).
STATE_DTYPE = torch.float16


@dataclass(frozen=True)
class TensorSpec:
    """One declared input, output or state of a graph: ``shape`` fixed, ``dtype`` a torch dtype, ``doc`` its meaning."""

    name: str
    shape: tuple
    dtype: torch.dtype
    doc: str = ""


def check_exportable(code_predictor) -> None:
    """Raise ``ValueError`` (one line) when ``code_predictor`` cannot be exported: not the official module, another
    RoPE type (:func:`~rvqspec_lib.decoding.predictor.check_code_predictor`), heads with a bias."""
    P.check_code_predictor(code_predictor, "export")
    if any(getattr(h, "bias", None) is not None for h in code_predictor.lm_head):
        raise ValueError("this code predictor's heads have a bias: the exported graphs support bias-free heads only "
                         "(as the released checkpoints)")


class _Graph(nn.Module):
    """The stepped and verify graphs' shared part: the lean stack over the official parameters, RoPE tables, cache."""

    def __init__(self, code_predictor, *, slots: int, batch: int, state: str):
        super().__init__()
        check_exportable(code_predictor)
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        lean = LeanStack(code_predictor, "export").eval()
        self.cp = code_predictor
        self.stack = lean  # holds code_predictor.model: the official parameters, read in place
        self.register_buffer("cos", lean.cos.clone(), persistent=False)  # (ROPE_POSITIONS, D)
        self.register_buffer("sin", lean.sin.clone(), persistent=False)
        self.batch, self.slots, self.state = int(batch), int(slots), state
        self.n_layers, self.n_kv, self.head_dim = lean.n_layers, lean.n_kv, lean.head_dim
        self.n_codes = P.n_codes(code_predictor)
        self.vocab = int(code_predictor.config.vocab_size)
        self.hidden = int(code_predictor.config.hidden_size)
        self.dtype = lean.dtype
        self.cache_dtype = STATE_DTYPE if state == "buffers" else self.dtype
        if state == "buffers":
            self.register_buffer("k_cache", torch.zeros(self.cache_shape, dtype=self.cache_dtype, device=lean.device))
            self.register_buffer("v_cache", torch.zeros(self.cache_shape, dtype=self.cache_dtype, device=lean.device))

    @property
    def cache_shape(self) -> tuple:
        """``(layers, B, kv_heads, slots, head_dim)``."""
        return (self.n_layers, self.batch, self.n_kv, self.slots, self.head_dim)

    def state_specs(self) -> list[TensorSpec]:
        """The two cache tensors (inputs and outputs with ``state="inputs"``, states with ``"buffers"``)."""
        doc = "keys of every layer after RoPE, one slot per cached position"
        return [TensorSpec("k_cache", self.cache_shape, self.cache_dtype, doc),
                TensorSpec("v_cache", self.cache_shape, self.cache_dtype, doc.replace("keys", "values").replace(
                    " after RoPE", ""))]

    def reset_state(self) -> None:
        """Zero the buffer cache (``state="buffers"``; a new frame)."""
        if self.state == "buffers":
            self.k_cache.zero_()
            self.v_cache.zero_()

    def _layers(self, x, positions, allow, write_slots, k_cache, v_cache):
        """The stack on ``x`` ``(B, Q, H)`` under ``allow`` ``(B, Q, S)`` 0/1 -> ``(hidden, k, v)``, new caches."""
        b, q_len = x.shape[0], x.shape[1]
        pos = positions.long().clamp(0, ROPE_POSITIONS - 1)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # (B, 1, Q, D)
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        mask = torch.where(allow > 0.5, zero, torch.full_like(zero, MASK_MIN))[:, None]  # (B, 1, Q, S)
        write = write_slots.long()[:, None, :, None].expand(b, self.n_kv, q_len, self.head_dim)
        k_new, v_new = k_cache.clone(), v_cache.clone()
        hid = self.stack(x, cos, sin, mask, write, k_new, v_new)
        return hid, k_new, v_new

    def _run(self, x, positions, allow, write_slots, k_cache, v_cache):
        if self.state == "inputs":
            return self._layers(x, positions, allow, write_slots, k_cache, v_cache)
        hid, k_new, v_new = self._layers(x, positions, allow, write_slots, self.k_cache.to(x.dtype),
                                         self.v_cache.to(x.dtype))
        self.k_cache[:] = k_new.to(self.cache_dtype)  # a full write of the state (Core ML: one update per call)
        self.v_cache[:] = v_new.to(self.cache_dtype)
        return hid, None, None


class SteppedGraph(_Graph):
    """One position per call (writes slot ``position``, attends to ``0..position``), every head's logits returned.

    Args:
        code_predictor: the official module (read in place). batch: rows per call (fixed in the graph).
        state: ``"inputs"`` (caches are inputs and outputs) or ``"buffers"`` (buffers updated in place).

    Inputs: ``inputs_embeds`` ``(B, 1, H)``; ``position`` ``(B,)`` int32 in ``0..n_codes``; with ``state="inputs"``
    ``k_cache``, ``v_cache`` ``(L, B, kv, n_codes + 1, D)``. Returns ``logits`` ``(B, n_codes, V)`` in the module's
    dtype (head i predicts code i + 1), then the updated caches with ``state="inputs"``.

    Raises:
        ValueError: see :func:`check_exportable`; an unknown ``state``.
    """

    graph = "stepped"

    def __init__(self, code_predictor, *, batch: int = 1, state: str = "inputs"):
        super().__init__(code_predictor, slots=P.n_codes(code_predictor) + 1, batch=batch, state=state)

    def forward(self, inputs_embeds, position, k_cache=None, v_cache=None):
        slot = torch.arange(self.slots, device=inputs_embeds.device)
        pos = position[:, None]  # (B, 1)
        allow = (slot[None, None, :] <= pos[:, :, None]).to(inputs_embeds.dtype)  # (B, 1, S): causal
        hid, k_new, v_new = self._run(inputs_embeds, pos, allow, pos, k_cache, v_cache)
        h = hid[:, 0]  # (B, H)
        logits = torch.stack([head(h) for head in self.cp.lm_head], 1)  # (B, n_codes, V)
        return logits if self.state == "buffers" else (logits, k_new, v_new)

    def input_specs(self) -> list[TensorSpec]:
        """Declared inputs, in ``forward``'s order (the caches follow with ``state="inputs"``)."""
        b = self.batch
        return [TensorSpec("inputs_embeds", (b, 1, self.hidden), self.dtype, "projected input embedding"),
                TensorSpec("position", (b,), torch.int32, "position in the frame, 0..n_codes (also the slot)")] + (
            self.state_specs() if self.state == "inputs" else [])

    def output_specs(self) -> list[TensorSpec]:
        """Declared outputs (the updated caches follow with ``state="inputs"``)."""
        out = [TensorSpec("logits", (self.batch, self.n_codes, self.vocab), self.dtype,
                          "logits of every head at this position (head i predicts code i + 1)")]
        return out + ([TensorSpec(s.name + "_out", s.shape, s.dtype, s.doc) for s in self.state_specs()]
                      if self.state == "inputs" else [])


class VerifyGraph(_Graph):
    """The fused verify call: the root and the tree's drafted nodes in one call (paper §2.2, Fig. 2).

    Args:
        code_predictor: the official module. n_query: query positions N (the root included).
        tree: the :class:`~rvqspec_lib.decoding.trees.DraftTree` of ``n_query - 1`` nodes (``outputs="logits"``).
        outputs: ``"logits"`` or ``"hidden"`` (any ``n_query >= 1``, no tree). batch, state: as :class:`SteppedGraph`.

    Inputs: ``inputs_embeds`` ``(B, N, H)``; ``positions`` ``(B, N)`` int32 (``positions[:, 0]``, the root's depth
    + 1, picks the heads); ``attention_mask`` ``(B, N, S)`` 0/1 float, ``S = n_codes + 1 + N``; ``write_slots``
    ``(B, N)`` int32 distinct slots; the caches (``state="inputs"``).

    Returns:
        In the module's dtype: ``verify_logits`` ``(B, N, V)`` (p after each node) and ``draft_logits``
        ``(B, N, K, V)``, K the tree's depth (next round's q, heads past the last clamped), or ``hidden``
        ``(B, N, H)``; then the updated caches (``state="inputs"``).

    Raises:
        ValueError: ``n_query`` outside 2..64 for logits (1..64 for hidden states), a tree of another size, an
            unknown ``outputs``; see :func:`check_exportable`.
    """

    graph = "verify"

    def __init__(self, code_predictor, n_query: int, *, tree: DraftTree | None = None, outputs: str = "logits",
                 batch: int = 1, state: str = "inputs"):
        if outputs not in ("logits", "hidden"):
            raise ValueError(f"outputs must be 'logits' or 'hidden', got {outputs!r}")
        lo = MIN_NODES if outputs == "logits" else 1
        if not isinstance(n_query, int) or isinstance(n_query, bool) or not lo <= n_query <= MAX_NODES:
            raise ValueError(f"the verify graph's node budget N must be an integer in {lo}..{MAX_NODES} (the root "
                             f"plus {lo - 1}..{MAX_NODES - 1} drafted nodes), got {n_query!r}")
        super().__init__(code_predictor, slots=P.n_codes(code_predictor) + 1 + n_query, batch=batch, state=state)
        self.n_query, self.outputs, self.tree = int(n_query), outputs, tree
        if outputs == "logits":
            if tree is None or tree.n_nodes != n_query - 1:
                have = "none" if tree is None else f"{tree.n_nodes} nodes"
                raise ValueError(f"a fused verify graph of N = {n_query} needs a tree of {n_query - 1} drafted "
                                 f"nodes (got {have}): e.g. DraftTree.chain({n_query - 1}) or a calibrated tree")
            depth = [int(d) for d in tree.depth]
            if depth != sorted(depth):
                raise ValueError("tree nodes must be in depth order (DraftTree.from_paths orders them so)")
            self.k_draft = max(depth)
            # nodes of offset t are the contiguous block groups[t] = (first, end) in node order
            self.groups = [(depth.index(t), len(depth) - depth[::-1].index(t)) for t in range(self.k_draft + 1)]
            w = torch.stack([h.weight.detach() for h in code_predictor.lm_head])  # (n_codes, V, H), a snapshot
            self.register_buffer("head_weight", w.clone(), persistent=False)

    def forward(self, inputs_embeds, positions, attention_mask, write_slots, k_cache=None, v_cache=None):
        hid, k_new, v_new = self._run(inputs_embeds, positions, attention_mask, write_slots, k_cache, v_cache)
        if self.outputs == "hidden":
            outs = (hid,)
        else:
            # heads used by the call: s .. s + 2K (node offset t <= K, then j <= K further), clamped to the last
            s = positions[:, 0].long() - 1  # (B,) the root's depth
            window = (s[:, None] + torch.arange(2 * self.k_draft + 1, device=s.device)).clamp(0, self.n_codes - 1)
            w = self.head_weight[window]  # (B, 2K+1, V, H)
            parts = []
            for t, (a, e) in enumerate(self.groups):  # nodes of offset t: verify head s+t, draft heads s+t+1..s+t+K
                x = hid[:, a:e]  # (B, n_t, H)
                parts.append(torch.einsum("bnh,bkvh->bnkv", x, w[:, t: t + self.k_draft + 1]))  # (B, n_t, K+1, V)
            lg = torch.cat(parts, 1)  # (B, N, K+1, V) in node order
            outs = (lg[:, :, 0], lg[:, :, 1:])
        return (outs[0] if len(outs) == 1 else outs) if self.state == "buffers" else (*outs, k_new, v_new)

    def input_specs(self) -> list[TensorSpec]:
        """Declared inputs, in ``forward``'s order."""
        b, n = self.batch, self.n_query
        return [TensorSpec("inputs_embeds", (b, n, self.hidden), self.dtype, "projected embeddings: root, nodes"),
                TensorSpec("positions", (b, n), torch.int32, "RoPE positions, depth + 1 of each node's code"),
                TensorSpec("attention_mask", (b, n, self.slots), self.dtype, "1 = may attend (tree mask + "
                           "committed slots)"),
                TensorSpec("write_slots", (b, n), torch.int32, "slot each query position is written to")] + (
            self.state_specs() if self.state == "inputs" else [])

    def output_specs(self) -> list[TensorSpec]:
        """Declared outputs."""
        b, n = self.batch, self.n_query
        if self.outputs == "hidden":
            out = [TensorSpec("hidden", (b, n, self.hidden), self.dtype, "last hidden states after the final norm")]
        else:
            out = [TensorSpec("verify_logits", (b, n, self.vocab), self.dtype, "p after each node (lm_head[d])"),
                   TensorSpec("draft_logits", (b, n, self.k_draft, self.vocab), self.dtype,
                              "next round's q from each node (lm_head[d+1..d+K])")]
        return out + ([TensorSpec(s.name + "_out", s.shape, s.dtype, s.doc) for s in self.state_specs()]
                      if self.state == "inputs" else [])


class FrameGraph(nn.Module):
    """A whole frame in one call, :meth:`rvqspec_lib.device.fused.FusedARFrame.frame`, as a module for export.

    Args:
        code_predictor: the official module. sampling: ``top_p`` must be 1. batch: frames per call (fixed).

    Inputs: ``context`` ``(B, 2, talker_hidden)``; ``noise`` ``(B, n_codes, V)`` float32 Gumbel noise
    (:meth:`FusedARFrame.noise`). Returns ``codes`` ``(B, n_codes)`` int32, codes 1..n_codes.

    Raises:
        ValueError: see :func:`check_exportable`; ``top_p < 1``.
    """

    graph = "frame"
    state = "none"

    def __init__(self, code_predictor, sampling: Sampling | None = None, *, batch: int = 1):
        super().__init__()
        check_exportable(code_predictor)
        self.cp = code_predictor  # the parameters FusedARFrame reads, registered here so that export finds them
        self.fused = FusedARFrame(code_predictor, sampling, compile=False)
        self.batch = int(batch)
        self.n_codes, self.vocab = self.fused.n_codes, self.fused.vocab
        self.talker_hidden = P.talker_hidden_size(code_predictor)
        self.dtype = P.param_dtype(code_predictor)

    def forward(self, context, noise):
        return self.fused.frame(context, noise).to(torch.int32)

    def input_specs(self) -> list[TensorSpec]:
        """Declared inputs."""
        b = self.batch
        return [TensorSpec("context", (b, 2, self.talker_hidden), self.dtype, "talker hidden state, embedding of "
                           "code 0"),
                TensorSpec("noise", (b, self.n_codes, self.vocab), torch.float32, "standard Gumbel noise")]

    def output_specs(self) -> list[TensorSpec]:
        """Declared outputs."""
        return [TensorSpec("codes", (self.batch, self.n_codes), torch.int32, "codes 1..n_codes")]

    def state_specs(self) -> list[TensorSpec]:
        """No state: the frame's cache lives inside the call."""
        return []


def build_graph(code_predictor, graph: str, *, nodes: int | None = None, tree: DraftTree | None = None,
                state: str = "inputs", sampling: Sampling | None = None) -> nn.Module:
    """One of :data:`GRAPHS` by name (what ``rvqspec export --graph`` builds); ``nodes`` (N, default 4) and ``tree``
    (default a chain of N - 1) are the verify graph's, ``sampling`` the frame graph's; ``state`` (``"inputs"`` for
    ONNX, ``"buffers"`` for Core ML) as :class:`SteppedGraph`'s; one row per call.

    Raises:
        ValueError: an unknown graph, N outside 2..64, ``nodes`` or ``tree`` given to a graph that has none, what
            the graph classes refuse.
    """
    if graph not in GRAPHS:
        raise ValueError(f"unknown graph {graph!r}: use one of {', '.join(GRAPHS)}")
    if graph != "verify" and (nodes is not None or tree is not None):
        raise ValueError(f"--nodes (and a tree) are for the verify graph; the {graph} graph has none")
    if graph == "stepped":
        return SteppedGraph(code_predictor, state=state).eval()
    if graph == "frame":
        return FrameGraph(code_predictor, sampling).eval()
    n = 4 if nodes is None and tree is None else (tree.n_nodes + 1 if nodes is None else nodes)
    if not isinstance(n, int) or isinstance(n, bool) or not MIN_NODES <= n <= MAX_NODES:
        raise ValueError(f"--nodes must be an integer in {MIN_NODES}..{MAX_NODES} (query positions of one verify "
                         f"call, the root included), got {n!r}")
    tree = DraftTree.chain(n - 1) if tree is None else tree
    return VerifyGraph(code_predictor, n, tree=tree, outputs="logits", state=state).eval()


def example_inputs(graph: nn.Module, *, seed: int = 0, frame_depth: int = 3) -> dict:
    """``{name: tensor}`` of the declared shapes for tracing and checking an export: a call at depth ``frame_depth``
    over random cached slots, or a random context and noise. Deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    dev = next(graph.parameters()).device

    def randn(*shape, dtype):
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=dev)

    if isinstance(graph, FrameGraph):
        fused = graph.fused
        return {"context": randn(graph.batch, 2, graph.talker_hidden, dtype=graph.dtype),
                "noise": fused.noise(graph.batch, g).to(dev)}
    b, dt = graph.batch, graph.dtype
    caches = {}
    if graph.state == "inputs":
        filled = frame_depth + isinstance(graph, VerifyGraph)
        for spec in graph.state_specs():
            c = torch.zeros(spec.shape, dtype=dt, device=dev)
            c[:, :, :, :filled] = randn(*spec.shape[:3], filled, spec.shape[4], dtype=dt)
            caches[spec.name] = c
    if isinstance(graph, SteppedGraph):
        d = min(frame_depth, graph.n_codes)
        return {"inputs_embeds": randn(b, 1, graph.hidden, dtype=dt),
                "position": torch.full((b,), d, dtype=torch.int32, device=dev), **caches}
    n, s = graph.n_query, graph.slots
    committed = frame_depth + 1  # slots 0..frame_depth: the prefill's two positions and codes 1..frame_depth-1
    tree = graph.tree if graph.tree is not None else DraftTree.chain(n - 1)
    depth = tree.depth.to(dev)
    allow = torch.zeros(b, n, s, dtype=dt, device=dev)
    allow[:, :, :committed] = 1
    allow[:, :, committed: committed + n] = tree.ancestors.to(dev, dt)
    return {"inputs_embeds": randn(b, n, graph.hidden, dtype=dt),
            "positions": (frame_depth + 1 + depth).to(torch.int32).expand(b, n).contiguous(),
            "attention_mask": allow,
            "write_slots": (committed + torch.arange(n, device=dev)).to(torch.int32).expand(b, n).contiguous(),
            **caches}


@torch.no_grad()
def reference_outputs(graph: nn.Module, inputs: dict) -> dict:
    """``{output name: tensor}`` the graph must compute, from the OFFICIAL module (``verify_forward``, each head)."""
    if isinstance(graph, FrameGraph):
        return {"codes": graph.fused.frame(inputs["context"], inputs["noise"]).to(torch.int32)}
    cp = graph.cp
    b = graph.batch
    cache = P.StaticSlotCache(cp, b, graph.slots)
    if "k_cache" in inputs:
        for i in range(graph.n_layers):
            cache._k[i] = inputs["k_cache"][i].clone()
            cache._v[i] = inputs["v_cache"][i].clone()
    slot = torch.arange(graph.slots)
    if isinstance(graph, SteppedGraph):
        pos = inputs["position"].long()[:, None]
        allow = slot[None, None, :] <= pos[:, :, None]
        hid = P.verify_forward(cp, inputs["inputs_embeds"], pos, allow, cache, pos)
        out = {"logits": torch.stack([head(hid[:, 0]) for head in cp.lm_head], 1)}
    else:
        pos = inputs["positions"].long()
        hid = P.verify_forward(cp, inputs["inputs_embeds"], pos, inputs["attention_mask"] > 0.5, cache,
                               inputs["write_slots"].long())
        if graph.outputs == "hidden":
            out = {"hidden": hid}
        else:
            n, k = graph.n_query, graph.k_draft
            d = (pos - 1).clamp(0, graph.n_codes - 1)  # (B, N) each node's depth: its verify head
            heads = cp.lm_head
            ver = torch.stack([torch.stack([heads[int(d[i, j])](hid[i, j]) for j in range(n)]) for i in range(b)])
            dr = torch.stack([torch.stack([torch.stack([heads[min(int(d[i, j]) + t, graph.n_codes - 1)](hid[i, j])
                                                        for t in range(1, k + 1)]) for j in range(n)])
                              for i in range(b)])
            out = {"verify_logits": ver, "draft_logits": dr}
    if graph.state == "inputs":
        out["k_cache_out"] = torch.stack(cache._k)
        out["v_cache_out"] = torch.stack(cache._v)
    return out
