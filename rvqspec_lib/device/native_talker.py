"""The native talker step: the talker's decoder layers and ``codec_head`` as one C call (``rvq_forward_scan``) over
packed copies of the weights, with a preallocated KV cache (docs/precision.md#the-native-talker: calls, RoPE, the KV
cache and its bytes, batches, and how it equals the official talker bit for bit).
"""

from __future__ import annotations

import torch

from rvqspec_lib.device.kernels import cpforward as C
from rvqspec_lib.device.native import PackedDecoder, packed_bytes, packed_linear
from rvqspec_lib.device.precision import ACTIVATION_DTYPE, precision_of

#: Positions the KV cache holds by default (224 MiB per stream on the 0.6B talker; 1024 frames are 82 s of speech).
DEFAULT_MAX_CONTEXT = 1024


class TalkerKVCache:
    """Preallocated KV slots of :class:`NativeTalker` (made by :meth:`NativeTalker.new_cache`).

    Attributes: ``k``, ``v`` ``(layers, B, kv_heads, max_context, head_dim)`` float32 or bfloat16, slot i holding
    position i (padding included; slots ``>= length`` never read); ``valid`` ``(B, max_context)`` bool, a real (not
    padded) position; ``next_pos`` ``(B,)`` int64, each stream's next RoPE position; ``length`` slots filled.
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = k, v
        with torch.inference_mode(False):  # normal tensors: updated in place in and out of inference mode
            self.valid = torch.zeros(k.shape[1], k.shape[3], dtype=torch.bool)  # (B, S)
            self.next_pos = torch.zeros(k.shape[1], dtype=torch.long)  # (B,)
        self.length = 0

    @property
    def batch(self) -> int:
        """Streams."""
        return int(self.k.shape[1])

    @property
    def max_context(self) -> int:
        """Capacity in positions."""
        return int(self.k.shape[3])

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values."""
        return 2 * self.k.numel() * self.k.element_size()

    def clear(self) -> None:
        """Length 0 (the memory is kept)."""
        self.valid.zero_()
        self.next_pos.zero_()
        self.length = 0

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (as ``DynamicCache.crop``); ValueError outside 0..:attr:`length`."""
        if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= self.length:
            raise ValueError(f"crop length must be an integer in 0..{self.length} (the positions cached), got "
                             f"{length!r}")
        self.valid[:, length:] = False
        self.next_pos.copy_(self.valid.long().sum(1))
        self.length = length

    def __repr__(self) -> str:
        return (f"TalkerKVCache(batch={self.batch}, max_context={self.max_context}, length={self.length}, "
                f"{self.nbytes / 2 ** 20:.1f} MiB)")


def _talker_of(obj):
    """The official talker (``Qwen3TTSTalkerForConditionalGeneration``) from itself, a loaded model or the whole
    official model; ``None`` when ``obj`` is none of them."""
    for cand in (obj, getattr(obj, "talker", None)):
        if cand is not None and hasattr(cand, "codec_head") and hasattr(getattr(cand, "model", None), "layers"):
            return cand
    return None


class NativeTalker:
    """The talker step as one C call over packed weights, with its own KV cache (module docstring).

    Args:
        talker: ``lm.model.talker``, the loaded model or the official model holding it, on the CPU, converted by
            :func:`~rvqspec_lib.device.precision.apply_precision` (float32, bfloat16, int8, int8-dynamic); its
            weights are COPIED at construction.
        max_context: positions the KV cache holds (prompt included), >= 1.
        kv_bfloat16: a bfloat16 KV cache (default: in bfloat16 and int8, where it is exact; refused where it rounds).

    Attributes: ``dtype`` (of the hidden states and logits returned), ``fast`` (the AVX-512 path runs),
    ``kv_bytes_per_position`` (per stream), ``weight_bytes`` (packed bytes one step streams, ``codec_head``
    included), ``decoder``.

    Raises:
        ValueError: not a talker, another precision, not on the CPU, a non-default RoPE, biases, ``max_context < 1``,
            ``kv_bfloat16=True`` where it rounds. RuntimeError: the C library cannot be built here.
    """

    name = "native"

    def __init__(self, talker, *, max_context: int = DEFAULT_MAX_CONTEXT, kv_bfloat16: bool | None = None):
        t = _talker_of(talker)
        if t is None:
            raise ValueError(f"NativeTalker needs the official talker (lm.model.talker) or the loaded model, got "
                             f"{type(talker).__name__}")
        precision = precision_of(t.model)
        if precision not in C.PREC_CODE:
            raise ValueError(f"the native talker runs float32, bfloat16, int8 or int8-dynamic, not {precision}: "
                             f"convert with apply_precision(lm.model.talker, 'float32') first")
        head_precision = precision_of(t.codec_head)
        if head_precision != precision:
            raise ValueError(f"the talker's layers are {precision} but codec_head is {head_precision}: convert the "
                             f"whole talker with apply_precision(lm.model.talker, {precision!r})")
        device = next(t.model.layers.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"the native talker runs on the CPU; the talker is on {device}: use the official "
                             f"talker there")
        cfg = t.model.config
        rope = getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"the native talker supports the default RoPE only, this config has rope_scaling={rope}")
        self.talker, self.precision = t, precision
        self.dtype = ACTIVATION_DTYPE[precision]
        self.fast = precision in C.fast_precisions()
        self.decoder = PackedDecoder(t.model, cfg, precision)
        self.hidden, self.n_layers = self.decoder.hidden, self.decoder.n_layers
        with torch.no_grad():
            self.head = packed_linear(precision, [t.codec_head])
        self.vocab = self.head.n
        self.weight_bytes = self.decoder.weight_bytes + packed_bytes(self.head)
        d = self.decoder
        self._lib = C.lib()
        if kv_bfloat16 is None:
            kv_bfloat16 = d.act_bf16
        if kv_bfloat16 and not d.act_bf16:
            raise ValueError(f"a bfloat16 KV cache would round the keys and values of the {precision} talker: use "
                             f"kv_bfloat16=None or False")
        self._lib.rvq_model_set_kv_bf16(d.handle, int(bool(kv_bfloat16)))  # never refused: checked above
        self.kv_dtype = torch.bfloat16 if kv_bfloat16 else torch.float32
        self.kv_bytes_per_position = 2 * d.n_layers * d.n_kv * d.head_dim * (2 if kv_bfloat16 else 4)
        #: Scan the whole capacity instead of the filled prefix (same bits): measures what the prefix scan saves
        #: (:func:`bench.latency.scan_cost`).
        self.scan_whole_cache = False
        self._cache: TalkerKVCache | None = None
        self._cos = self._sin = None
        self._check_max_context(max_context)
        self.max_context = int(max_context)

    @staticmethod
    def _check_max_context(max_context) -> None:
        if not isinstance(max_context, int) or isinstance(max_context, bool) or max_context < 1:
            raise ValueError(f"max_context must be a positive integer (positions the talker KV cache holds), got "
                             f"{max_context!r}")

    # -- the KV cache ----------------------------------------------------------------------------------------------
    @property
    def cache(self) -> TalkerKVCache | None:
        """The KV cache the steps use (``None`` before the first :meth:`prefill` / :meth:`reset`)."""
        return self._cache

    @property
    def length(self) -> int:
        """Positions cached (0 without a cache)."""
        return 0 if self._cache is None else self._cache.length

    @property
    def batch(self) -> int:
        """Streams of the cache (0 without a cache)."""
        return 0 if self._cache is None else self._cache.batch

    def new_cache(self, batch: int, max_context: int | None = None) -> TalkerKVCache:
        """A new empty KV cache for ``batch`` streams of ``max_context`` positions (default :attr:`max_context`),
        installed by :meth:`use_cache`; ValueError for either below 1."""
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive integer (independent streams), got {batch!r}")
        max_context = self.max_context if max_context is None else max_context
        self._check_max_context(max_context)
        d = self.decoder
        shape = (d.n_layers, batch, d.n_kv, int(max_context), d.head_dim)
        # never read before written: attention reads slots < length only, each written by the step that filled it
        with torch.inference_mode(False):
            return TalkerKVCache(torch.empty(shape, dtype=self.kv_dtype), torch.empty(shape, dtype=self.kv_dtype))

    def use_cache(self, cache: TalkerKVCache) -> None:
        """Run the next steps on ``cache`` (one of :meth:`new_cache`); ValueError for another talker's shape."""
        d = self.decoder
        if not isinstance(cache, TalkerKVCache) or cache.k.shape[0] != d.n_layers or cache.k.shape[2] != d.n_kv \
                or cache.k.shape[4] != d.head_dim or cache.k.dtype != self.kv_dtype:
            raise ValueError("use_cache takes a TalkerKVCache made by this talker's new_cache(batch, max_context)")
        if self._cos is None or self._cos.shape[0] < cache.max_context:
            self._cos, self._sin = self._rope_tables(cache.max_context)
        self._cache = cache

    def reset(self, batch: int | None = None, *, max_context: int | None = None) -> None:
        """Empty the KV cache, reallocating it only when ``batch`` (default: the current) or ``max_context`` changes.

        Raises:
            ValueError: ``batch < 1``, ``max_context < 1``, no batch given and no cache yet.
        """
        if max_context is not None:
            self._check_max_context(max_context)
            self.max_context = int(max_context)
        if batch is None:
            if self._cache is None:
                raise ValueError("reset needs batch= (streams) before the talker has a KV cache")
            batch = self._cache.batch
        c = self._cache
        if c is not None and c.batch == batch and c.max_context == self.max_context:
            c.clear()
            return
        self._cache = None  # free the old cache first
        self.use_cache(self.new_cache(batch, self.max_context))

    def crop(self, length: int) -> None:
        """:meth:`TalkerKVCache.crop` on the cache in use (e.g. to rerun steps after a shared prompt)."""
        if self._cache is None:
            raise ValueError("the talker has no KV cache yet: call prefill(embeds) first")
        self._cache.crop(length)

    def _rope_tables(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``(n, head_dim)`` float32: the official rotary values at positions 0..n-1, MRoPE axis 0."""
        pos = torch.arange(n).view(1, 1, n).expand(3, 1, n)  # (3, 1, n)
        with torch.no_grad():
            cos, sin = self.talker.model.rotary_emb(torch.zeros(1, dtype=self.dtype), pos)  # (3, 1, n, D)
        return cos[0, 0].to(torch.float32).contiguous(), sin[0, 0].to(torch.float32).contiguous()

    # -- the steps -------------------------------------------------------------------------------------------------
    def prefill(self, embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Start new sequences: :meth:`reset` to this batch and :meth:`extend` by the prompt ``embeds``
        ``(B, T, hidden)`` (:func:`rvqspec_lib.models.frame.build_prompt`), ``attention_mask`` 0 on LEFT padding."""
        b = self._check_embeds(embeds, "embeds", None)
        self.reset(batch=b)
        return self.extend(embeds, attention_mask)

    def step(self, embed: torch.Tensor) -> torch.Tensor:
        """:meth:`extend` by one position per stream: ``embed`` ``(B, 1, hidden)`` -> ``(B, 1, hidden)``."""
        if isinstance(embed, torch.Tensor) and embed.dim() == 3 and embed.shape[1] != 1:
            raise ValueError(f"step takes one position per stream, (B, 1, {self.hidden}), got {tuple(embed.shape)}: "
                             f"use extend for several")
        return self.extend(embed)

    def extend(self, embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Append ``T`` positions to every stream (causal among themselves).

        Args:
            embeds: ``(B, T, hidden)`` float, B the cache's batch.
            attention_mask: ``(B, T)`` int or bool, 0 on padded positions (a slot taken, never attended).

        Returns:
            ``(B, T, hidden)`` after the final norm, in :attr:`dtype`.

        Raises:
            ValueError: no prefill yet, another batch or hidden size, a mask of the wrong shape, past the capacity
                (naming ``max_context``). MemoryError: the C forward could not allocate its scratch memory.
        """
        c = self._cache
        if c is None:
            raise ValueError("the talker has no KV cache yet: call prefill(embeds) (or reset(batch)) first")
        b = self._check_embeds(embeds, "embeds", c.batch)
        t = int(embeds.shape[1])
        if attention_mask is None:
            real = torch.ones(b, t, dtype=torch.bool)
        else:
            if tuple(attention_mask.shape) != (b, t):
                raise ValueError(f"attention_mask must have shape (B, T) = {(b, t)}, got "
                                 f"{tuple(attention_mask.shape)}")
            real = attention_mask.to(torch.bool).cpu()
        n = c.length + t
        if n > c.max_context:
            raise ValueError(f"context {n} exceeds the talker KV cache capacity of {c.max_context} positions: raise "
                             f"max_context (NativeTalker(..., max_context=N) or reset(max_context=N))")
        slots = torch.arange(c.length, n)  # (T,) the new positions' slots
        c.valid[:, c.length:n] = real
        # a real position's RoPE position: its index among its stream's real tokens (the official rule)
        pos = c.next_pos[:, None] + real.long().cumsum(1) - 1  # (B, T)
        pos = torch.where(real, pos, torch.zeros_like(pos))
        ns = c.max_context if self.scan_whole_cache else n  # slots the C call scans
        causal = slots[:, None] >= torch.arange(ns)[None, :]  # (T, ns): new row i sees slots <= length + i
        allow = c.valid[:, None, :ns] & causal[None]  # (B, T, ns)
        # a padded row sees its own slot alone (finite, never read)
        allow[:, :, c.length:n] |= (~real)[:, :, None] & torch.eye(t, dtype=torch.bool)[None]
        allow = allow.to(torch.uint8).contiguous()
        cos, sin = self._cos[pos.reshape(-1)].contiguous(), self._sin[pos.reshape(-1)].contiguous()  # (B*T, D)
        write = slots[None].expand(b, t).contiguous()  # (B, T) int64
        x = embeds.detach().reshape(b * t, self.hidden).to(torch.float32).contiguous()
        out = torch.empty(b * t, self.hidden, dtype=torch.float32)
        rc = self._lib.rvq_forward_scan(self.decoder.handle, C.ptr(x), C.ptr(cos), C.ptr(sin), C.ptr(allow),
                                        C.ptr(write), C.ptr(c.k), C.ptr(c.v), b, t, c.max_context, ns, C.ptr(out))
        if rc:
            c.valid[:, c.length:n] = False  # nothing was appended
            if rc == -1:
                raise MemoryError("the native talker could not allocate its scratch memory")
            raise ValueError(f"the native talker's C forward refused its arguments (code {rc})")
        c.next_pos += real.long().sum(1)
        c.length = n
        return out.view(b, t, self.hidden).to(self.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``codec_head`` in C: ``hidden`` ``(..., hidden)`` float -> ``(..., vocab)`` logits in :attr:`dtype`.

        Raises:
            ValueError: a last dimension other than the talker's hidden size.
        """
        if not isinstance(hidden, torch.Tensor) or hidden.dim() < 1 or hidden.shape[-1] != self.hidden:
            got = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
            raise ValueError(f"hidden must have shape (..., {self.hidden}) (the talker's hidden size), got {got}")
        x = hidden.detach().reshape(-1, self.hidden).to(torch.float32).contiguous()
        y = self.head(x, act_bf16=self.decoder.act_bf16)
        return y.view(*hidden.shape[:-1], self.vocab).to(self.dtype)

    def _check_embeds(self, embeds, what: str, batch: int | None) -> int:
        if not isinstance(embeds, torch.Tensor) or embeds.dim() != 3 or embeds.shape[0] < 1 or embeds.shape[1] < 1 \
                or embeds.shape[2] != self.hidden:
            got = tuple(embeds.shape) if isinstance(embeds, torch.Tensor) else type(embeds).__name__
            raise ValueError(f"{what} must have shape (B, T, {self.hidden}) (the talker's hidden size), got {got}")
        if batch is not None and embeds.shape[0] != batch:
            raise ValueError(f"{what} has {embeds.shape[0]} streams but the talker KV cache holds {batch}: call "
                             f"prefill (or reset(batch={embeds.shape[0]})) first")
        return int(embeds.shape[0])

    def __repr__(self) -> str:
        return (f"NativeTalker(precision={self.precision!r}, fast={self.fast}, max_context={self.max_context}, "
                f"length={self.length}, batch={self.batch})")
