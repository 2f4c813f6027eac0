"""The official code predictor ("MultiCodeDecoder") driven one call at a time, with tree masks and a slot KV cache.

Positions inside a frame (docs/model.md#inner-loop-positions): pos 0 = projected talker hidden state, pos 1 = projected talker embedding
of code 0, pos j+1 = projected ``codec_embedding[j-1](code j)``; the hidden state at pos j goes through
``lm_head[j-1]`` to give code j. Every call here goes through the official modules (``model.codec_embedding``,
``small_to_mtp_projection``, ``model`` = the decoder stack, ``lm_head``); only the attention mask, the position ids
and the cache are ours, so that a packed tree of drafts can be verified in ONE call where each node sees only its
ancestors (paper §2.2, Fig. 2).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache


class SlotCache(DynamicCache):
    """A KV cache of "slots" with a per-row validity mask instead of a length.

    RoPE is applied before keys are cached, so attention does not depend on the order of the slots: a verify call
    appends all its nodes, and rejected nodes are simply marked invalid (then compacted away by :meth:`keep`).
    Rows of a batch may hold different numbers of valid slots (rows accept different lengths).
    """

    def __init__(self, n_layers: int):
        super().__init__()
        self._k: list[torch.Tensor | None] = [None] * n_layers
        self._v: list[torch.Tensor | None] = [None] * n_layers

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):  # noqa: D102 (transformers API)
        if self._k[layer_idx] is None:
            self._k[layer_idx], self._v[layer_idx] = key_states, value_states
        else:
            self._k[layer_idx] = torch.cat([self._k[layer_idx], key_states], dim=-2)
            self._v[layer_idx] = torch.cat([self._v[layer_idx], value_states], dim=-2)
        return self._k[layer_idx], self._v[layer_idx]

    def get_seq_length(self, layer_idx: int | None = 0) -> int:  # noqa: D102
        k = self._k[layer_idx or 0]
        return 0 if k is None else int(k.shape[-2])

    def keep(self, valid: torch.Tensor) -> torch.Tensor:
        """Drop invalid slots. ``valid``: ``(B, L)`` bool. Returns the new ``(B, L')`` validity (valid slots first)."""
        n = int(valid.sum(1).max())
        if n == valid.shape[1] and bool(valid.all()):
            return valid
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices[:, :n]  # (B, L') valid first
        for i, k in enumerate(self._k):
            if k is None:
                continue
            idx = order[:, None, :, None].expand(k.shape[0], k.shape[1], n, k.shape[3])
            self._k[i] = k.gather(2, idx)
            self._v[i] = self._v[i].gather(2, idx)
        return valid.gather(1, order)


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


def forward(code_predictor, embeds: torch.Tensor, positions: torch.Tensor, valid_old: torch.Tensor | None,
            self_mask: torch.Tensor, cache: SlotCache) -> torch.Tensor:
    """One code-predictor call: ``Q`` new positions attend to the valid cached slots and to the new positions allowed
    by ``self_mask``.

    Args:
        embeds: ``(B, Q, H)`` projected inputs. positions: ``(B, Q)`` int64 RoPE positions (restart at 0 each frame).
        valid_old: ``(B, L)`` bool cached slots each row may attend to (``None`` when the cache is empty).
        self_mask: ``(B, Q, Q)`` bool, ``[b, i, j]`` true when new position i may attend to new position j.
        cache: appended with the Q new slots.

    Returns:
        ``(B, Q, H)`` last hidden states (after the final norm).
    """
    b, q, _ = embeds.shape
    allow = self_mask if valid_old is None else torch.cat([valid_old[:, None, :].expand(b, q, -1), self_mask], 2)
    mask = torch.zeros(allow.shape, dtype=embeds.dtype, device=embeds.device)
    mask.masked_fill_(~allow, torch.finfo(embeds.dtype).min)
    mask = mask[:, None]  # (B, 1, Q, L + Q)
    start = cache.get_seq_length()
    out = code_predictor.model(
        inputs_embeds=embeds,
        attention_mask={"full_attention": mask, "sliding_attention": mask},
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        cache_position=torch.arange(start, start + q, device=embeds.device),
    )
    return out.last_hidden_state
