"""A lean forward of the code predictor over the OFFICIAL module's own parameters (no copy of weights or code): the
same operations in the same order as the official call, as plain tensor code without transformers' plumbing, so the
hidden states are BIT-IDENTICAL in float32 (tests/test_lean.py; the overhead it removes:
docs/offline.md#verify-cost-on-this-cpu). :class:`LeanCodePredictor` is a verify backend; ``compile=True`` runs the
layer stack under ``torch.compile(dynamic=False, fullgraph=True)``, one graph per input shape.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from rvqspec_lib.device.precision import Int8Linear
from rvqspec_lib.decoding import predictor as P

#: RoPE positions tabulated: a frame uses positions 0..n_codes, plus the offsets of nodes past the frame's last depth
#: (never fed: their rows are masked); 256 covers any tree of the 64-node budget. Larger positions are clamped.
ROPE_POSITIONS = 256
#: Graphs dynamo may keep for the layer stack: one per (batch, query count, slots) met by the decoders in use, over
#: every compiled instance (they share one code object).
RECOMPILE_LIMIT = 256


def timed_call(fn, key, compile_s: dict, *args):
    """``fn(*args)`` for a compiled ``fn`` under a recompile limit of :data:`RECOMPILE_LIMIT` (every instance shares one
    code object); the wall time of the first call of ``key`` (its compile) goes to ``compile_s[key]``."""
    first = key not in compile_s
    t0 = time.perf_counter()
    with torch._dynamo.config.patch(recompile_limit=max(RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)):
        out = fn(*args)
    if first:
        compile_s[key] = time.perf_counter() - t0
    return out


class LeanCache:
    """A slot KV cache as two tensors ``k``, ``v`` of shape ``(layers, B, kv_heads, slots, head_dim)``."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = k, v

    @property
    def n_slots(self) -> int:
        """Slots S of the cache."""
        return int(self.k.shape[3])


class SlotBackend:
    """What the verify backends over a :class:`LeanCache` share: the cache, its compaction, the official embeddings
    and heads. A subclass sets ``code_predictor``, ``n_layers``, ``n_kv``, ``head_dim``, ``cache_dtype`` and
    ``device``, and implements ``forward``."""

    def new_cache(self, batch: int, slots: int) -> LeanCache:
        """An empty (zero) cache of ``slots`` slots for ``batch`` rows, in ``cache_dtype``."""
        shape = (self.n_layers, batch, self.n_kv, slots, self.head_dim)
        return LeanCache(torch.zeros(shape, dtype=self.cache_dtype, device=self.device),
                         torch.zeros(shape, dtype=self.cache_dtype, device=self.device))

    def compact(self, cache: LeanCache, order: torch.Tensor) -> None:
        """Reorder slots: slot ``order[b, i]`` moves to position i (``order`` ``(B, slots)`` int64)."""
        if order.shape[0] == 1:  # one row: a plain slot selection, no index of the cache's full size
            cache.k, cache.v = cache.k.index_select(3, order[0]), cache.v.index_select(3, order[0])
            return
        idx = order[None, :, None, :, None].expand_as(cache.k)
        cache.k, cache.v = cache.k.gather(3, idx), cache.v.gather(3, idx)

    def embed(self, codes: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """:func:`rvqspec_lib.decoding.predictor.embed_codes`."""
        return P.embed_codes(self.code_predictor, codes, depth)

    def logits(self, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """:func:`rvqspec_lib.decoding.predictor.head_logits`."""
        return P.head_logits(self.code_predictor, hidden, head)


class LeanStack(nn.Module):
    """The decoder stack as one pure tensor function (what is compiled and exported) over the official
    ``code_predictor.model``'s parameters in place, the rotary tables ``cos``, ``sin`` ``(ROPE_POSITIONS, D)`` once.

    Raises:
        ValueError: what :func:`rvqspec_lib.decoding.predictor.check_code_predictor` refuses.
    """

    def __init__(self, code_predictor, who: str = "LeanCodePredictor"):
        super().__init__()
        P.check_code_predictor(code_predictor, who)
        cfg, self.model = code_predictor.config, code_predictor.model
        self.n_layers = len(self.model.layers)
        self.n_heads, self.n_kv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = P.head_dim(cfg)
        self.eps = float(cfg.rms_norm_eps)
        self.scaling = self.head_dim ** -0.5
        p = next(code_predictor.parameters())
        self.dtype, self.device = p.dtype, p.device
        with torch.no_grad():
            cos, sin = self.model.rotary_emb(torch.zeros(1, dtype=self.dtype, device=self.device),
                                             torch.arange(ROPE_POSITIONS, device=self.device)[None])
        self.cos, self.sin = cos[0], sin[0]

    def proj(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``module`` on ``x``: an ``Int8Linear`` through its own int8 forward, any other through ``F.linear``."""
        if isinstance(module, Int8Linear):
            return module(x)
        return F.linear(x, module.weight, module.bias)

    def rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm as the official one: statistics in float32, scaled back in the input dtype."""
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        """transformers' ``rotate_half``: ``(x1, x2) -> (-x2, x1)`` over the last dimension."""
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def forward(self, x, cos, sin, mask, write, k_cache, v_cache):
        """Args: x ``(B, Q, H)``; cos, sin ``(B, 1, Q, D)``; mask ``(B, 1, Q, S)`` additive float; write
        ``(B, kv, Q, D)`` int64 slot index; k_cache, v_cache ``(L, B, kv, S, D)`` (written in place).
        Returns ``(B, Q, H)`` after the final norm."""
        b, q_len, _ = x.shape
        lin, rms = self.proj, self.rms
        rep = self.n_heads // self.n_kv
        for i, layer in enumerate(self.model.layers):
            att, mlp = layer.self_attn, layer.mlp
            h = rms(x, layer.input_layernorm.weight)
            q = rms(lin(att.q_proj, h).view(b, q_len, -1, self.head_dim),
                    att.q_norm.weight).transpose(1, 2)  # (B, heads, Q, D)
            k = rms(lin(att.k_proj, h).view(b, q_len, -1, self.head_dim),
                    att.k_norm.weight).transpose(1, 2)  # (B, kv, Q, D)
            v = lin(att.v_proj, h).view(b, q_len, -1, self.head_dim).transpose(1, 2)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            k_all, v_all = k_cache[i], v_cache[i]
            k_all.scatter_(2, write, k)
            v_all.scatter_(2, write, v)
            s = k_all.shape[2]
            if rep > 1:  # grouped-query attention, expanded as the official SDPA path does when a mask is given
                k_all = k_all[:, :, None].expand(b, self.n_kv, rep, s, self.head_dim).reshape(b, -1, s, self.head_dim)
                v_all = v_all[:, :, None].expand(b, self.n_kv, rep, s, self.head_dim).reshape(b, -1, s, self.head_dim)
            a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=self.scaling)
            a = a.transpose(1, 2).contiguous().reshape(b, q_len, -1)  # (B, Q, heads * D)
            x = x + lin(att.o_proj, a)
            h = rms(x, layer.post_attention_layernorm.weight)
            x = x + lin(mlp.down_proj, F.silu(lin(mlp.gate_proj, h)) * lin(mlp.up_proj, h))
        return rms(x, self.model.norm.weight)


class LeanCodePredictor(SlotBackend):
    """The verify backend over the official code predictor's parameters, read in place (module docstring).

    Args:
        code_predictor: the official module. compile: run the layer stack under ``torch.compile``.
        compile_mode: ``mode=`` for ``torch.compile`` (``"reduce-overhead"``: CUDA graphs on a GPU).

    Raises:
        ValueError: what :func:`rvqspec_lib.decoding.predictor.check_code_predictor` refuses.
    """

    def __init__(self, code_predictor, *, compile: bool = False, compile_mode: str | None = None):
        self.code_predictor = code_predictor
        self.stack = st = LeanStack(code_predictor).eval()
        self.n_layers, self.n_kv, self.head_dim, self.dtype, self.device = st.n_layers, st.n_kv, st.head_dim, \
            st.dtype, st.device
        self.cache_dtype, self.cos, self.sin = self.dtype, st.cos, st.sin  # (ROPE_POSITIONS, D)
        self.mask_min = torch.finfo(self.dtype).min
        self.compiled = bool(compile)
        self.compile_s: dict[tuple, float] = {}
        self._run = torch.compile(self.stack, dynamic=False, fullgraph=True, mode=compile_mode) \
            if compile else self.stack
        self.name = "compile" if compile else "eager"

    # -- the backend protocol (rvqspec_lib.decoding.predictor.VerifyBackend) -----------------------------------------
    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor, cache: LeanCache,
                write_slots: torch.Tensor) -> torch.Tensor:
        """The verify call, as :func:`rvqspec_lib.decoding.predictor.verify_forward`."""
        b, q_len, _ = embeds.shape
        pos = positions.clamp(max=ROPE_POSITIONS - 1)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # (B, 1, Q, D)
        mask = torch.zeros(allow.shape, dtype=embeds.dtype, device=embeds.device)
        mask.masked_fill_(~allow, self.mask_min)
        write = write_slots[:, None, :, None].expand(b, self.n_kv, q_len, self.head_dim)
        args = (embeds, cos, sin, mask[:, None], write, cache.k, cache.v)
        if not self.compiled:
            return self.stack(*args)
        return timed_call(self._run, (b, q_len, cache.n_slots), self.compile_s, *args)

    def apply(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A linear layer of the code predictor (a head, a projection) on ``x`` ``(..., in)`` as the stack applies its
        own (``LeanStack.proj``): ``(..., out)`` in the activation dtype."""
        return self.stack.proj(module, x)

    def __repr__(self) -> str:
        return f"LeanCodePredictor(compile={self.compiled})"
