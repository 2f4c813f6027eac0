"""Drafters: where the draft distributions q come from (paper Table 2; docs/methods.md#reused-heads,
#medusa-heads, #position-aware-offsets). ``draft_logits`` gives logits for depths k+1..k+n_ahead from H_k through
the verify backend's ``logits`` (``None``: the official heads); past K offsets a trained drafter falls back to the
reused head. Files: ``rvqspec_lib.models.drafter_files``.
"""

from __future__ import annotations

import torch
from torch import nn

from rvqspec_lib.decoding.predictor import head_logits, n_codes

#: Drafter names (``--drafter`` on the command line).
DRAFTERS = ("heads", "offsets", "medusa")


#: The paper's number of drafted offsets (Table 2: K=3 for every drafter).
DEFAULT_K = 3


def _heads(code_predictor, hidden: torch.Tensor, head: torch.Tensor, logits) -> torch.Tensor:
    """The code predictor's own heads on ``hidden`` ``(N, H)``, ``head`` ``(N,)``, through ``logits`` if given."""
    return head_logits(code_predictor, hidden, head) if logits is None else logits(hidden, head)


def _offsets(n_ahead: int, device) -> torch.Tensor:
    return torch.arange(1, n_ahead + 1, device=device)


class ReusedHeads:
    """``lm_head[k+j-1](H_k)``: the code predictor's own heads, no new parameters, any number of offsets."""

    name = "heads"
    K = None
    params_added = 0

    def draft_logits(self, code_predictor, hidden: torch.Tensor, depth: torch.Tensor, n_ahead: int, *,
                     logits=None) -> torch.Tensor:
        """``(B, n_ahead, V)`` logits, entry j-1 drafting depth k+j, from ``hidden`` ``(B, H)`` H_k and ``depth``
        ``(B,)`` int64 k; entries past the last depth hold clamped-head logits that callers must ignore."""
        b = hidden.shape[0]
        j = _offsets(n_ahead, hidden.device)
        head = (depth[:, None] + j[None, :] - 1).reshape(-1)  # (B*K,)
        h = hidden[:, None, :].expand(b, n_ahead, hidden.shape[-1]).reshape(b * n_ahead, -1)
        return _heads(code_predictor, h, head, logits).reshape(b, n_ahead, -1)

    def describe(self) -> dict:
        """JSON-able description."""
        return {"name": self.name, "K": None, "params_added": 0}


class _Trained(nn.Module):
    """What the trained drafters share: their parameters are the parameters they add, and one description."""

    @property
    def params_added(self) -> int:
        """Parameters the drafter adds (all of its own)."""
        return sum(p.numel() for p in self.parameters())

    def describe(self) -> dict:
        """JSON-able description: ``name``, :meth:`config`, ``params_added``."""
        return {"name": self.name, **self.config(), "params_added": self.params_added}


class PositionOffsets(_Trained):
    """The paper's drafter: ``lm_head[k+j-1](H_k + b_j)``, K learned vectors of ``hidden_size`` shared across start
    depths; zero at init, where it equals :class:`ReusedHeads`."""

    name = "offsets"

    def __init__(self, K: int = DEFAULT_K, hidden_size: int = 1024):
        super().__init__()
        _check_k(K)
        self.offsets = nn.Parameter(torch.zeros(K, hidden_size))  # (K, H): b_1..b_K
        self.provenance: dict = {}

    @classmethod
    def for_code_predictor(cls, code_predictor, K: int = DEFAULT_K) -> "PositionOffsets":
        """Zero offsets sized for ``code_predictor``, on its device (float32 parameters whatever its dtype)."""
        dev = next(code_predictor.parameters()).device
        return cls(K, int(code_predictor.config.hidden_size)).to(dev)

    @property
    def K(self) -> int:
        """Offsets learned (drafts for depths k+1..k+K)."""
        return int(self.offsets.shape[0])

    @property
    def hidden_size(self) -> int:
        """Width of each offset vector."""
        return int(self.offsets.shape[1])

    def draft_logits(self, code_predictor, hidden: torch.Tensor, depth: torch.Tensor, n_ahead: int, *,
                     logits=None) -> torch.Tensor:
        """As :meth:`ReusedHeads.draft_logits` with ``H_k + b_j`` (hidden states' dtype); differentiable in the
        offsets."""
        b, hs = hidden.shape
        if hs != self.hidden_size:
            raise ValueError(f"offsets are for hidden size {self.hidden_size}, the code predictor's is {hs}")
        n_off = min(self.K, n_ahead)
        off = self.offsets[:n_off].to(hidden.dtype)
        if n_ahead > n_off:  # offsets past K: none (the reused head)
            off = torch.cat([off, off.new_zeros(n_ahead - n_off, hs)], 0)
        h = hidden[:, None, :] + off[None]  # (B, n_ahead, H)
        head = (depth[:, None] + _offsets(n_ahead, hidden.device)[None, :] - 1).reshape(-1)
        return _heads(code_predictor, h.reshape(b * n_ahead, hs), head, logits).reshape(b, n_ahead, -1)

    def config(self) -> dict:
        """The constructor's arguments (what a drafter file records to rebuild it)."""
        return {"K": self.K, "hidden_size": self.hidden_size}


class MedusaHead(nn.Module):
    """One Medusa head: ``Linear(hidden, vocab)`` after an optional zero-initialised residual block
    ``h + SiLU(W h + c)`` (Medusa's; the paper's parameter count has none, the default)."""

    def __init__(self, hidden_size: int, vocab_size: int, residual_block: bool = False):
        super().__init__()
        self.block = nn.Linear(hidden_size, hidden_size) if residual_block else None
        if self.block is not None:
            nn.init.zeros_(self.block.weight)
            nn.init.zeros_(self.block.bias)
        self.linear = nn.Linear(hidden_size, vocab_size, bias=False)

    @property
    def out_features(self) -> int:
        """Codebook size V (read by :func:`~rvqspec_lib.decoding.predictor.head_logits`)."""
        return self.linear.out_features

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``(..., hidden)`` -> ``(..., V)`` logits."""
        if self.block is not None:
            h = h + nn.functional.silu(self.block(h))
        return self.linear(h)


class MedusaHeads(_Trained):
    """Fresh heads ``head[k, j](H_k)`` per start depth k and offset j with ``k + j <= n_codes`` (39 for 15 codes,
    K = 3; the paper's 45 counts 6 that would draft past the last depth), initialised from ``lm_head[k+j-1]``
    (equal to :class:`ReusedHeads` until trained); ``residual_block``: Medusa's block before each head."""

    name = "medusa"

    def __init__(self, K: int = DEFAULT_K, n_codes: int = 15, hidden_size: int = 1024, vocab_size: int = 2048,
                 residual_block: bool = False):
        super().__init__()
        _check_k(K)
        if n_codes < 2:
            raise ValueError(f"n_codes must be >= 2 (a frame with one code has nothing to draft), got {n_codes}")
        self.pairs = [(k, j) for k in range(1, n_codes) for j in range(1, K + 1) if k + j <= n_codes]
        index = torch.full((n_codes + 1, K + 1), -1, dtype=torch.long)  # [k, j] -> head, -1: none
        for i, (k, j) in enumerate(self.pairs):
            index[k, j] = i
        self.register_buffer("index", index, persistent=False)
        self.heads = nn.ModuleList(MedusaHead(hidden_size, vocab_size, residual_block) for _ in self.pairs)
        self._K, self.n_codes, self.residual_block = K, n_codes, residual_block
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.provenance: dict = {}

    @classmethod
    def for_code_predictor(cls, code_predictor, K: int = DEFAULT_K) -> "MedusaHeads":
        """Heads sized for ``code_predictor`` (float32, on its device), each a copy of ``lm_head[k+j-1]``."""
        cfg = code_predictor.config
        dev = next(code_predictor.parameters()).device
        m = cls(K, n_codes(code_predictor), int(cfg.hidden_size), int(cfg.vocab_size)).to(dev)
        with torch.no_grad():
            for (k, j), head in zip(m.pairs, m.heads):
                head.linear.weight.copy_(code_predictor.lm_head[k + j - 1].weight.float())
        return m

    @property
    def K(self) -> int:
        """Offsets drafted by heads of their own."""
        return self._K

    def draft_logits(self, code_predictor, hidden: torch.Tensor, depth: torch.Tensor, n_ahead: int, *,
                     logits=None) -> torch.Tensor:
        """As :meth:`ReusedHeads.draft_logits` with ``head[k, j]`` where it exists (hidden states' dtype)."""
        b, hs = hidden.shape
        if hs != self.hidden_size:
            raise ValueError(f"Medusa heads are for hidden size {self.hidden_size}, the code predictor's is {hs}")
        dev = hidden.device
        j = _offsets(n_ahead, dev)[None, :].expand(b, n_ahead)
        k = depth[:, None].expand(b, n_ahead)
        idx = torch.full((b, n_ahead), -1, dtype=torch.long, device=dev)
        ok = (k >= 1) & (k <= self.n_codes) & (j <= self.K)
        idx[ok] = self.index.to(dev)[k[ok], j[ok]]
        h = hidden[:, None, :].expand(b, n_ahead, hs)
        own = idx >= 0
        out = torch.empty(b, n_ahead, self.vocab_size, dtype=hidden.dtype, device=dev)
        if bool(own.any()):
            w_dtype = self.heads[0].linear.weight.dtype
            out[own] = head_logits(code_predictor, h[own].to(w_dtype), idx[own], heads=self.heads).to(hidden.dtype)
        if not bool(own.all()):
            out[~own] = _heads(code_predictor, h[~own], (k + j - 1)[~own], logits).to(out.dtype)
        return out

    def config(self) -> dict:
        """The constructor's arguments (what a drafter file records to rebuild it)."""
        return {"K": self.K, "n_codes": self.n_codes, "hidden_size": self.hidden_size,
                "vocab_size": self.vocab_size, "residual_block": self.residual_block}

    def describe(self) -> dict:
        """As the other drafters', with ``n_heads``, the heads that exist."""
        return {**super().describe(), "n_heads": len(self.heads)}


def _check_k(K) -> None:
    if not isinstance(K, int) or isinstance(K, bool) or K < 1:
        raise ValueError(f"K (offsets drafted) must be a positive integer, got {K!r}")


def _check_name(name) -> None:
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}: choose one of {', '.join(DRAFTERS)} (heads = reused LM heads, "
                         "offsets = position-aware offsets, medusa = fresh Medusa heads)")


def fresh_drafter(name: str, code_predictor, *, K: int = DEFAULT_K):
    """An untrained drafter for ``code_predictor`` (equal to :class:`ReusedHeads`). Raises ValueError: an unknown
    name; ``K`` outside ``1 .. n_codes``."""
    _check_name(name)
    if name == "heads":
        return ReusedHeads()
    n = int(code_predictor.config.num_code_groups) - 1
    if not 1 <= int(K) <= n:
        raise ValueError(f"K={K} is out of range for a code predictor of {n} codes: use 1..{n} (offsets past "
                         f"{n - 1} are never drafted; the paper uses K=3)")
    if name == "offsets":
        return PositionOffsets.for_code_predictor(code_predictor, K)
    return MedusaHeads.for_code_predictor(code_predictor, K)


def draft_batch(drafter, code_predictor, hidden: torch.Tensor, K: int):
    """Draft logits from start depths k = 1..n-1 of teacher-forced ``hidden`` ``(N, n, H)``: ``(logits (N, n-1, K,
    V) float32, depth (N, n-1, K) int64 = k + j, valid (N, n-1, K) bool = k + j <= n)``."""
    nb, n, h = hidden.shape
    k = torch.arange(1, n, device=hidden.device)
    logits = drafter.draft_logits(code_predictor, hidden[:, : n - 1].reshape(nb * (n - 1), h), k.repeat(nb), K)
    d = (k[:, None] + torch.arange(1, K + 1, device=hidden.device)[None, :]).expand(nb, n - 1, K)
    return logits.reshape(nb, n - 1, K, -1).float(), d, d <= n
