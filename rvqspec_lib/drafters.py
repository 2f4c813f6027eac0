"""Drafters: where the draft distributions q for the next depths come from.

Interface (used by the Chain and Tree decoders): ``draft_logits(code_predictor, hidden, depth, n_ahead)`` returns the
draft logits for depths ``depth + 1 .. depth + n_ahead`` from the hidden state that produced the code at ``depth``.

* :class:`ReusedHeads` (paper Table 2 row (i); TensorRT-Edge-LLM's chain, seed 003): ``lm_head[k+j-1](H_k)``,
  no new parameters.
"""

from __future__ import annotations

import torch

from .predictor import head_logits


class ReusedHeads:
    """Draft depth k+j with the code predictor's own head for that depth applied to H_k (no new parameters).

    Paper §2.1 / Table 2 (i): "the K=3 neighbouring codebook heads LMH_{k+1..k+3} draft from the position-k
    hidden state".
    """

    name = "heads"
    params_added = 0

    def draft_logits(self, code_predictor, hidden: torch.Tensor, depth: torch.Tensor, n_ahead: int) -> torch.Tensor:
        """Draft logits.

        Args:
            hidden: ``(B, H)`` hidden state H_k that produced code k. depth: ``(B,)`` int64 k (1..n_codes).
            n_ahead: K, number of depths to draft.

        Returns:
            ``(B, K, V)`` logits; entry j-1 drafts depth k+j with ``lm_head[k+j-1]``. Entries past the last depth
            hold clamped-head logits that callers must ignore.
        """
        b = hidden.shape[0]
        j = torch.arange(1, n_ahead + 1, device=hidden.device)
        head = (depth[:, None] + j[None, :] - 1).reshape(-1)  # (B*K,)
        h = hidden[:, None, :].expand(b, n_ahead, hidden.shape[-1]).reshape(b * n_ahead, -1)
        return head_logits(code_predictor, h, head).reshape(b, n_ahead, -1)
