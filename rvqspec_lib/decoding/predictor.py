"""The official code predictor ("MultiCodeDecoder") driven one call at a time, with tree masks and a slot KV cache.

Positions inside a frame (docs/model.md#inner-loop-positions): pos 0 = projected talker hidden state, pos 1 = projected talker embedding
of code 0, pos j+1 = projected ``codec_embedding[j-1](code j)``; the hidden state at pos j goes through
``lm_head[j-1]`` to give code j. Every call here goes through the official modules (``model.codec_embedding``,
``small_to_mtp_projection``, ``model`` = the decoder stack, ``lm_head``); only the attention mask, the position ids
and the cache are ours, so that a packed tree of drafts can be verified in ONE call where each node sees only its
ancestors (paper §2.2, Fig. 2), with shapes fixed by the tree (:class:`StaticSlotCache`, :func:`verify_forward`).

The decode loop reaches the model only through a small backend protocol (:class:`VerifyBackend`: a cache, the
verify call, the cache compaction, input embeddings and head logits). :class:`OfficialBackend` implements it with the
official module (the calls above); a faster forward over the same weights (``rvqspec_lib.models.lean``) implements
it too, without this layer importing it.
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
    return next(module.parameters()).dtype


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
    """A KV cache of a FIXED number of slots, so every call of a frame has fixed shapes (compile or export it once).

    Per layer, keys and values are ``(B, kv_heads, slots, head_dim)`` tensors allocated up front. Before each call
    :attr:`write_slots` ``(B, Q)`` says where the call's Q new positions go; the call then attends over ALL slots, and
    an attention mask of shape ``(B, 1, Q, slots)`` says which it may see. A frame needs at most
    ``2 + (n_codes - 1)`` committed slots (the prefill's two positions and codes 1..n_codes-1; the last code is never
    fed) plus the ``Q`` nodes of one verify call: ``slots = n_codes + 1 + Q_max``.

    RoPE is applied before keys are cached, so attention does not depend on where a slot sits: after a verify call,
    :meth:`compact` moves the kept slots (committed ones first, then the accepted nodes) to the front, in one gather
    of fixed shape.
    """

    def __init__(self, code_predictor, batch: int, slots: int, *, device=None):
        super().__init__()
        cfg = code_predictor.config
        dtype = param_dtype(code_predictor)
        device = device or next(code_predictor.parameters()).device
        kv, hd = int(cfg.num_key_value_heads), int(getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        shape = (batch, kv, slots, hd)
        self.n_slots = int(slots)
        self._k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self._v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.write_slots: torch.Tensor | None = None

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):  # noqa: D102 (transformers API)
        idx = self.write_slots[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[3])
        self._k[layer_idx].scatter_(2, idx, key_states)
        self._v[layer_idx].scatter_(2, idx, value_states)
        return self._k[layer_idx], self._v[layer_idx]

    def get_seq_length(self, layer_idx: int | None = 0) -> int:  # noqa: D102
        return self.n_slots

    def compact(self, order: torch.Tensor) -> None:
        """Reorder slots: ``order`` ``(B, slots)`` int64, slot ``order[b, i]`` moves to position i."""
        for i, k in enumerate(self._k):
            idx = order[:, None, :, None].expand(k.shape[0], k.shape[1], -1, k.shape[3])
            self._k[i] = k.gather(2, idx)
            self._v[i] = self._v[i].gather(2, idx)


def verify_forward(code_predictor, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor,
                   cache: StaticSlotCache, write_slots: torch.Tensor) -> torch.Tensor:
    """THE code-predictor call of a decode round, with shapes fixed by the tree: ``Q`` query positions attend to the
    cache's slots that ``allow`` permits (docs/methods.md#the-tree-as-data).

    Every tensor's shape depends only on the batch, the tree's node count and the cache size, never on how far the
    frame has got, so one compiled or exported graph serves every round of every frame.

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
    """What the decode loop needs from the model (docs/style.md#the-decode-round): a fixed-size cache, THE verify
    call, the cache compaction after a round, input embeddings and head logits.

    ``forward`` takes and returns exactly what :func:`verify_forward` does (without the module argument); ``cache``
    is whatever ``new_cache`` returned. Implementations: :class:`OfficialBackend` (the official module, the
    reference) and ``rvqspec_lib.models.lean.LeanCodePredictor`` (a functional forward over the same weights).
    """

    name: str

    def new_cache(self, batch: int, slots: int): ...

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor, cache,
                write_slots: torch.Tensor) -> torch.Tensor: ...

    def compact(self, cache, order: torch.Tensor) -> None: ...

    def embed(self, codes: torch.Tensor, depth: torch.Tensor) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor: ...


class OfficialBackend:
    """:class:`VerifyBackend` through the official module: :class:`StaticSlotCache`, :func:`verify_forward`,
    :func:`embed_codes`, :func:`head_logits` (the reference every other backend is tested against).

    Args:
        code_predictor: the official module (``model.talker.code_predictor``).
    """

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
