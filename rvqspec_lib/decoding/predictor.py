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
    """What every faster forward over the official weights needs (``who``: the class that asks).

    Raises:
        ValueError: not the official code predictor; a RoPE type other than the default (docs/model.md#architecture).
    """
    if not (hasattr(code_predictor, "model") and hasattr(code_predictor, "lm_head")
            and hasattr(code_predictor.model, "layers")):
        raise ValueError(f"{who} needs the official code predictor (lm.code_predictor), got "
                         f"{type(code_predictor).__name__}")
    rope = getattr(code_predictor.config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"{who} supports plain RoPE only, this config has rope_scaling={rope}")


def embed_codes(code_predictor, codes: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """Projected input embeddings of codes at given depths.

    Args:
        codes: ``(...)`` int64 code ids. depth: ``(...)`` int64 depth j in 1..n_codes of each code
            (``codec_embedding[j-1]`` embeds code j); out-of-range depths are clamped (callers mask those slots).

    Returns:
        ``(..., hidden)`` in the module's dtype, after ``small_to_mtp_projection``.
    """
    tables = code_predictor.model.codec_embedding
    flat_c, flat_d = codes.reshape(-1), (depth.reshape(-1) - 1).clamp(0, len(tables) - 1)
    out = torch.empty(flat_c.shape[0], tables[0].embedding_dim, dtype=tables[0].weight.dtype, device=codes.device)
    for t in torch.unique(flat_d).tolist():
        sel = flat_d == t
        out[sel] = tables[t](flat_c[sel])
    out = code_predictor.small_to_mtp_projection(out)
    return out.reshape(*codes.shape, -1)


def head_logits(code_predictor, hidden: torch.Tensor, head: torch.Tensor, *, heads=None) -> torch.Tensor:
    """Logits of per-depth heads applied row by row.

    Args:
        hidden: ``(N, H)`` code-predictor hidden states. head: ``(N,)`` int64 head index (``lm_head[i]`` predicts
            code i+1); clamped to the valid range (callers mask out-of-range rows).
        heads: a ``ModuleList`` of heads to use instead of ``code_predictor.lm_head`` (Medusa-style drafters).

    Returns:
        ``(N, V)`` logits in the module's dtype.
    """
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
        """transformers' ``Cache.update``: write the call's keys and values ``(B, kv_heads, Q, head_dim)`` at
        :attr:`write_slots` of layer ``layer_idx``; return that layer's whole ``(B, kv_heads, slots, head_dim)``."""
        idx = self.write_slots[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[3])
        self._k[layer_idx].scatter_(2, idx, key_states)
        self._v[layer_idx].scatter_(2, idx, value_states)
        return self._k[layer_idx], self._v[layer_idx]

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        """transformers' ``Cache.get_seq_length``: the slot count (every call attends over all slots)."""
        return self.n_slots

    def compact(self, order: torch.Tensor) -> None:
        """Reorder slots: ``order`` ``(B, slots)`` int64, slot ``order[b, i]`` moves to position i."""
        for i, k in enumerate(self._k):
            idx = order[:, None, :, None].expand(k.shape[0], k.shape[1], -1, k.shape[3])
            self._k[i] = k.gather(2, idx)
            self._v[i] = self._v[i].gather(2, idx)


def verify_forward(code_predictor, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor,
                   cache: StaticSlotCache, write_slots: torch.Tensor) -> torch.Tensor:
    """THE code-predictor call of a decode round: ``Q`` query positions attend to the slots ``allow`` permits; every
    shape depends on the batch, the tree and the cache size only, so one graph serves every round.

    Args:
        embeds: ``(B, Q, H)`` projected inputs (the root's code and the drafted nodes' codes).
        positions: ``(B, Q)`` int64 RoPE positions (restart at 0 each frame; depth + 1 of each node's code).
        allow: ``(B, Q, S)`` bool, ``[b, i, j]`` true when query i may attend to slot j (every query must allow at
            least its own slot).
        cache: a :class:`StaticSlotCache` of ``S`` slots; the call writes its Q positions at ``write_slots``.
        write_slots: ``(B, Q)`` int64 distinct slot indices, in ``[0, S)``.

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
    """What the decode loop needs from the model, the protocol every verify backend implements (the registry:
    ``rvqspec_lib.models.backends``). B rows, Q query positions, S slots, H hidden size, V codebook size. A backend
    only computes: it draws no random numbers.

    Attributes:
        name: the backend's name in the registry (``"official"``, ``"eager"``, ``"compile"``, ``"onnx"``, ...).
    """

    name: str

    def new_cache(self, batch: int, slots: int):
        """An empty KV cache of ``slots`` slots for ``batch`` rows, of the backend's own type (one frame's)."""

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor, cache,
                write_slots: torch.Tensor) -> torch.Tensor:
        """THE verify call, arguments and result as :func:`verify_forward` (``cache``: :meth:`new_cache`'s; the
        result in the module's activation dtype)."""

    def compact(self, cache, order: torch.Tensor) -> None:
        """Reorder the cache's slots in place: slot ``order[b, i]`` moves to position i (``(B, S)`` int64)."""

    def embed(self, codes: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """Projected input embeddings, as :func:`embed_codes`."""

    def logits(self, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """The per-depth heads row by row, as :func:`head_logits` (drafters apply the heads through this too)."""


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
