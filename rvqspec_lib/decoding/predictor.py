"""The official code predictor driven one call at a time, with tree masks and a slot KV cache: only the mask, the
position ids and the cache are ours (positions: docs/model.md#inner-loop-positions; the tree mask:
docs/methods.md#the-tree-as-data). The decode loop reaches the model through :class:`VerifyBackend`;
:class:`OfficialBackend` is its reference implementation, the faster ones live in ``rvqspec_lib.models``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from transformers.cache_utils import DynamicCache


def n_codes(code_predictor) -> int:
    """Codes the code predictor emits per frame (n_code_groups - 1 = 15 on released checkpoints)."""
    return int(code_predictor.config.num_code_groups) - 1


def talker_hidden_size(code_predictor) -> int:
    """Width of the context the code predictor takes (the talker's hidden size)."""
    return int(code_predictor.model.codec_embedding[0].embedding_dim)


def param_dtype(module) -> torch.dtype:
    """The dtype of ``module``'s first parameter (the code predictor's compute dtype)."""
    return next(module.parameters()).dtype


def head_dim(config) -> int:
    """Width of one attention head: ``config.head_dim`` (Qwen3 configs carry it), else ``hidden_size / heads``."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def check_code_predictor(code_predictor, who: str) -> None:
    """Raise ValueError (naming ``who``) unless a faster forward can run on this code predictor: the official one,
    plain RoPE (docs/model.md#architecture)."""
    if not (hasattr(code_predictor, "model") and hasattr(code_predictor, "lm_head")
            and hasattr(code_predictor.model, "layers")):
        raise ValueError(f"{who} needs the official code predictor (lm.code_predictor), got "
                         f"{type(code_predictor).__name__}")
    rope = getattr(code_predictor.config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"{who} supports plain RoPE only, this config has rope_scaling={rope}")


def embed_codes(code_predictor, codes: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """``(..., hidden)`` projected embeddings (module dtype) of int64 ``codes`` at ``depth`` j
    (``codec_embedding[j-1]``; out-of-range depths clamped, callers mask those slots)."""
    tables = code_predictor.model.codec_embedding
    flat_c, flat_d = codes.reshape(-1), (depth.reshape(-1) - 1).clamp(0, len(tables) - 1)
    out = torch.empty(flat_c.shape[0], tables[0].embedding_dim, dtype=tables[0].weight.dtype, device=codes.device)
    for t in torch.unique(flat_d).tolist():
        sel = flat_d == t
        out[sel] = tables[t](flat_c[sel])
    out = code_predictor.small_to_mtp_projection(out)
    return out.reshape(*codes.shape, -1)


def head_logits(code_predictor, hidden: torch.Tensor, head: torch.Tensor, *, heads=None) -> torch.Tensor:
    """``(N, V)`` logits of ``hidden`` ``(N, H)`` through ``lm_head[head]`` row by row (``head`` ``(N,)`` int64,
    clamped; ``lm_head[i]`` predicts code i+1), or through ``heads`` (Medusa-style drafters)."""
    heads = code_predictor.lm_head if heads is None else heads
    head = head.clamp(0, len(heads) - 1)
    out = torch.empty(hidden.shape[0], heads[0].out_features, dtype=hidden.dtype, device=hidden.device)
    for i in torch.unique(head).tolist():
        sel = head == i
        out[sel] = heads[i](hidden[sel])
    return out


class StaticSlotCache(DynamicCache):
    """A KV cache of a FIXED number of slots, so every call of a frame has fixed shapes: per layer ``(B, kv_heads,
    slots, head_dim)``. :attr:`write_slots` ``(B, Q)`` says where a call's Q positions go; the call attends over all
    slots under its mask. A frame needs ``n_codes + 1 + Q`` slots (the last code is never fed). Keys are cached after
    RoPE, so :meth:`compact` may move slots.
    """

    def __init__(self, code_predictor, batch: int, slots: int):
        super().__init__()
        cfg = code_predictor.config
        dtype = param_dtype(code_predictor)
        device = next(code_predictor.parameters()).device
        kv, hd = int(cfg.num_key_value_heads), head_dim(cfg)
        shape = (batch, kv, slots, hd)
        self.n_slots = int(slots)
        self._k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self._v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.write_slots: torch.Tensor | None = None

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        """transformers' ``Cache.update``: write keys and values at :attr:`write_slots`; return the layer's all."""
        idx = self.write_slots[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[3])
        self._k[layer_idx].scatter_(2, idx, key_states)
        self._v[layer_idx].scatter_(2, idx, value_states)
        return self._k[layer_idx], self._v[layer_idx]

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        """transformers' ``Cache.get_seq_length``: the slot count."""
        return self.n_slots

    def compact(self, order: torch.Tensor) -> None:
        """Reorder slots: ``order`` ``(B, slots)`` int64, slot ``order[b, i]`` moves to position i."""
        for i, k in enumerate(self._k):
            idx = order[:, None, :, None].expand(k.shape[0], k.shape[1], -1, k.shape[3])
            self._k[i] = k.gather(2, idx)
            self._v[i] = self._v[i].gather(2, idx)


def verify_forward(code_predictor, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor,
                   cache: StaticSlotCache, write_slots: torch.Tensor) -> torch.Tensor:
    """THE code-predictor call of a decode round; shapes depend on the batch, tree and cache size only.

    Args:
        embeds: ``(B, Q, H)`` projected inputs. positions: ``(B, Q)`` int64 RoPE positions (depth + 1 of each code).
        allow: ``(B, Q, S)`` bool, query i may attend to slot j (every query at least its own slot).
        cache: a :class:`StaticSlotCache` of ``S`` slots, written at ``write_slots`` ``(B, Q)`` (distinct, int64).

    Returns:
        ``(B, Q, H)`` last hidden states (after the final norm).
    """
    cache.write_slots = write_slots
    mask = torch.zeros(allow.shape, dtype=embeds.dtype, device=embeds.device)
    mask.masked_fill_(~allow, torch.finfo(embeds.dtype).min)
    mask = mask[:, None]  # (B, 1, Q, S)
    out = code_predictor.model(
        inputs_embeds=embeds,
        attention_mask={"full_attention": mask, "sliding_attention": mask},
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        cache_position=torch.arange(embeds.shape[1], device=embeds.device),
    )
    return out.last_hidden_state


@runtime_checkable
class VerifyBackend(Protocol):
    """What the decode loop needs from the model (the registry: ``rvqspec_lib.models.backends``; ``name`` is the
    backend's there). A backend only computes: it draws no random numbers."""

    name: str

    def new_cache(self, batch: int, slots: int):
        """An empty KV cache of ``slots`` slots for ``batch`` rows (one frame's)."""

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor, cache,
                write_slots: torch.Tensor) -> torch.Tensor:
        """THE verify call, as :func:`verify_forward` (``cache``: :meth:`new_cache`'s), in the activation dtype."""

    def compact(self, cache, order: torch.Tensor) -> None:
        """Reorder the cache's slots in place: slot ``order[b, i]`` moves to position i (``(B, S)`` int64)."""

    def embed(self, codes: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """Projected input embeddings, as :func:`embed_codes`."""

    def logits(self, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """The per-depth heads row by row, as :func:`head_logits` (drafters too)."""


class OfficialBackend:
    """:class:`VerifyBackend` through the official ``code_predictor`` (the functions above): the reference every
    other backend is tested against."""

    name = "official"

    def __init__(self, code_predictor):
        self.code_predictor = code_predictor

    def new_cache(self, batch: int, slots: int) -> StaticSlotCache:
        return StaticSlotCache(self.code_predictor, batch, slots)

    def forward(self, embeds, positions, allow, cache, write_slots):
        return verify_forward(self.code_predictor, embeds, positions, allow, cache, write_slots)

    def compact(self, cache: StaticSlotCache, order: torch.Tensor) -> None:
        cache.compact(order)

    def embed(self, codes, depth):
        return embed_codes(self.code_predictor, codes, depth)

    def logits(self, hidden, head):
        return head_logits(self.code_predictor, hidden, head)

    def __repr__(self) -> str:
        return "OfficialBackend()"
