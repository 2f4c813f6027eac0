"""The official code predictor ("MultiCodeDecoder") driven one call at a time, with tree masks and a slot KV cache.

Positions inside a frame (docs/model.md#inner-loop-positions): pos 0 = projected talker hidden state, pos 1 = projected talker embedding
of code 0, pos j+1 = projected ``codec_embedding[j-1](code j)``; the hidden state at pos j goes through
``lm_head[j-1]`` to give code j. Every call here goes through the official modules (``model.codec_embedding``,
``small_to_mtp_projection``, ``model`` = the decoder stack, ``lm_head``); only the attention mask, the position ids
and the cache are ours, so that a packed tree of drafts can be verified in ONE call where each node sees only its
ancestors (paper §2.2, Fig. 2), with shapes fixed by the tree (:class:`StaticSlotCache`, :func:`verify_forward`).

The decode loop reaches the model only through a small backend protocol (:class:`VerifyBackend`: a cache, the
verify call, the cache compaction, input embeddings and head logits). :class:`OfficialBackend` implements it with the
official module (the calls above); the faster forwards over the same weights (the registry,
``rvqspec_lib.models.backends``) implement it too, without this layer importing them.
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
    """The dtype of ``module``'s first parameter (the code predictor's compute dtype; bfloat16 for the ``int8``
    precision, whose remaining float parameters are bfloat16)."""
    return next(module.parameters()).dtype


def head_dim(config) -> int:
    """Width of one attention head: ``config.head_dim`` (Qwen3 configs carry it), else ``hidden_size / heads``."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def check_code_predictor(code_predictor, who: str) -> None:
    """What every faster forward over the official weights needs (``who``: the class that asks).

    Raises:
        ValueError: (one line) not the official code predictor (``model.talker.code_predictor``: a ``model`` with
            ``layers``, ``lm_head``); a RoPE type other than the default (the released configs use plain RoPE,
            docs/model.md#architecture).
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
    """What the decode loop needs from the model (docs/style.md#the-decode-round): the one protocol every verify
    backend implements (the registry of backends: :mod:`rvqspec_lib.models.backends`; the reference implementation:
    :class:`OfficialBackend`). Shapes: B rows, Q query positions of one call, S cache slots, H the code predictor's
    hidden size, V its codebook size. Random numbers are never drawn here: a backend only computes.

    Attributes:
        name: the backend's name in the registry (``"official"``, ``"eager"``, ``"compile"``, ``"onnx"``,
            ``"native"``): what tables and labels call it.
    """

    name: str

    def new_cache(self, batch: int, slots: int):
        """An empty KV cache of ``slots`` slots for ``batch`` rows (of this backend's own type: a
        :class:`StaticSlotCache` for the official module, a ``LeanCache`` of two tensors for the others); the cache
        of one frame, passed back to :meth:`forward` and :meth:`compact`."""

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor, cache,
                write_slots: torch.Tensor) -> torch.Tensor:
        """THE verify call, as :func:`verify_forward` (without its module argument).

        Args:
            embeds: ``(B, Q, H)`` projected inputs (:meth:`embed`'s, or the projected context for the prefill).
            positions: ``(B, Q)`` int64 RoPE positions. allow: ``(B, Q, S)`` bool, ``[b, i, j]`` true when query i
            may attend to slot j (each query allows at least its own slot). cache: :meth:`new_cache`'s, written in
            place at ``write_slots`` ``(B, Q)`` int64 (distinct slots in ``[0, S)``).

        Returns:
            ``(B, Q, H)`` last hidden states (after the final norm) in the module's activation dtype.
        """

    def compact(self, cache, order: torch.Tensor) -> None:
        """Reorder the cache's slots in place: slot ``order[b, i]`` moves to position i (``order``: ``(B, S)``
        int64, a permutation per row); after a tree round, the kept slots move to the front."""

    def embed(self, codes: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """Projected input embeddings: ``codes`` ``(...)`` int64 at ``depth`` ``(...)`` int64 in 1..n_codes (code j
        embedded by ``codec_embedding[j-1]``, then ``small_to_mtp_projection``) -> ``(..., H)``, as
        :func:`embed_codes`."""

    def logits(self, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """The per-depth heads row by row: ``hidden`` ``(N, H)``, ``head`` ``(N,)`` int64 (``lm_head[i]`` predicts
        code i+1; clamped) -> ``(N, V)`` logits in the activation dtype, as :func:`head_logits`. Drafters apply
        the code predictor's own heads through this too (``draft_logits(..., logits=backend.logits)``)."""


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
        """:meth:`VerifyBackend.new_cache`: a :class:`StaticSlotCache`."""
        return StaticSlotCache(self.code_predictor, batch, slots)

    def forward(self, embeds, positions, allow, cache, write_slots):
        """:meth:`VerifyBackend.forward`: :func:`verify_forward`."""
        return verify_forward(self.code_predictor, embeds, positions, allow, cache, write_slots)

    def compact(self, cache: StaticSlotCache, order: torch.Tensor) -> None:
        """:meth:`VerifyBackend.compact`: :meth:`StaticSlotCache.compact`."""
        cache.compact(order)

    def embed(self, codes, depth):
        """:meth:`VerifyBackend.embed`: :func:`embed_codes`."""
        return embed_codes(self.code_predictor, codes, depth)

    def logits(self, hidden, head):
        """:meth:`VerifyBackend.logits`: :func:`head_logits`."""
        return head_logits(self.code_predictor, hidden, head)

    def __repr__(self) -> str:
        return "OfficialBackend()"
