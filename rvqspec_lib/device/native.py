"""The native forward: the code predictor's verify call as ONE C call over packed copies of the official module's
weights, row invariant, at the weight-streaming floor, in the precision the module was converted to
(docs/precision.md#the-native-forward; tests/test_native.py).
"""

from __future__ import annotations

import torch
from torch import nn

from rvqspec_lib.decoding import predictor as P
from rvqspec_lib.device.kernels import cpforward as C
from rvqspec_lib.device.lean import ROPE_POSITIONS, LeanCache, SlotBackend
from rvqspec_lib.device.precision import Int8Linear, precision_of


def _weight_of(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, scale) of a linear layer as the packer takes them."""
    if getattr(module, "bias", None) is not None:
        raise ValueError("the native forward packs linear layers without bias (the released code predictors and "
                         "talkers have none)")
    if isinstance(module, Int8Linear):
        return module.weight_int8, module.scale.to(torch.float32)
    return module.weight.detach().to(torch.float32), None


def packed_linear(precision: str, modules: list[nn.Module]) -> C.PackedLinear:
    """Bias-free linear layers (``nn.Linear`` or ``Int8Linear``, one input width) stacked along the outputs and packed
    in ``precision`` (a key of ``cpforward.PREC_CODE``): a ``PackedLinear`` of ``sum(out)`` outputs, a copy.

    Raises:
        ValueError: a layer with a bias.
    """
    ws = [_weight_of(m) for m in modules]
    w = torch.cat([a for a, _ in ws], 0)
    s = None if ws[0][1] is None else torch.cat([b for _, b in ws], 0)
    return C.PackedLinear(precision, w, s)


class PackedDecoder:
    """Packed COPIES of an official Qwen3-shaped decoder stack (``code_predictor.model`` or ``talker.model``, in
    ``precision``, a key of ``cpforward.PREC_CODE``) on one C model handle, shared by the code predictor's and the
    talker's native forwards.

    Attributes: ``handle`` (the C model, valid while this object lives), ``act_bf16`` (activations rounded to
    bfloat16), ``n_layers``, ``hidden``, ``n_heads``, ``n_kv``, ``head_dim``, ``intermediate``, ``weight_bytes`` (bytes
    of the packed layers and norms, what a call streams).

    Raises:
        ValueError: an unknown precision; an odd head width or one over ``cpforward.MAX_HEAD_DIM``; a linear layer
            with a bias.
        RuntimeError: the C library cannot be built here, or the model cannot be allocated.
    """

    def __init__(self, model: nn.Module, config, precision: str):
        if precision not in C.PREC_CODE:
            raise ValueError(f"the native forward runs float32, bfloat16, int8 or int8-dynamic, not {precision}: "
                             f"convert with apply_precision(module, 'float32') first")
        lib = C.lib()
        self.precision = precision
        self.act_bf16 = precision in C.BF16_ACTIVATIONS
        self.n_layers = len(model.layers)
        self.n_heads, self.n_kv = int(config.num_attention_heads), int(config.num_key_value_heads)
        self.head_dim = P.head_dim(config)
        self.hidden = int(config.hidden_size)
        if self.head_dim > C.MAX_HEAD_DIM or self.head_dim % 2:
            raise ValueError(f"the native forward needs an even head width <= {C.MAX_HEAD_DIM}, got {self.head_dim}")
        self.intermediate = int(model.layers[0].mlp.gate_proj.out_features)
        self.handle = lib.rvq_model_new(C.PREC_CODE[precision], self.n_layers, self.hidden, self.n_heads, self.n_kv,
                                        self.head_dim, self.intermediate, float(config.rms_norm_eps),
                                        int(self.act_bf16))
        if not self.handle:
            raise RuntimeError("the native forward could not allocate its model")
        self._keep: list = []
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                att, mlp = layer.self_attn, layer.mlp
                for which, mods in enumerate(([att.q_proj, att.k_proj, att.v_proj], [att.o_proj],
                                              [mlp.gate_proj, mlp.up_proj], [mlp.down_proj])):
                    pk = packed_linear(precision, mods)
                    self._keep.append(pk)
                    lib.rvq_model_set_linear(self.handle, i, which, C.ptr(pk.data), C.ptr(pk.scale), C.ptr(pk.comp),
                                             pk.n, pk.k)
                for which, norm in enumerate((layer.input_layernorm, layer.post_attention_layernorm, att.q_norm,
                                              att.k_norm)):
                    w = norm.weight.detach().to(torch.float32).contiguous()
                    self._keep.append(w)
                    lib.rvq_model_set_norm(self.handle, i, which, C.ptr(w))
            w = model.norm.weight.detach().to(torch.float32).contiguous()
            self._keep.append(w)
            lib.rvq_model_set_norm(self.handle, -1, 0, C.ptr(w))
        self.weight_bytes = sum(packed_bytes(k) for k in self._keep)

    def __del__(self):
        h = getattr(self, "handle", None)
        if h and C._LIB.lib is not None:
            C._LIB.lib.rvq_model_free(h)
            self.handle = None


def packed_bytes(item) -> int:
    """Bytes a call streams of a packed layer (weights, scales, corrections) or a norm vector."""
    if isinstance(item, C.PackedLinear):
        return sum(t.numel() * t.element_size() for t in (item.data, item.scale, item.comp) if t is not None)
    return item.numel() * item.element_size()


class NativeCodePredictor(SlotBackend):
    """The verify backend whose call is one C function over packed weights (module docstring).

    Args:
        code_predictor: the official module on the CPU in one of the four precisions; its weights are COPIED.

    Attributes: ``fast`` (this CPU runs this precision through the AVX-512 path), ``handle`` (the C model).

    Raises:
        ValueError: not the official code predictor, another RoPE type or precision, not on the CPU, what
            :class:`PackedDecoder` refuses. RuntimeError: the C library cannot be built here (one line).
    """

    name = "native"

    def __init__(self, code_predictor):
        P.check_code_predictor(code_predictor, "NativeCodePredictor")
        precision = precision_of(code_predictor)
        if precision not in C.PREC_CODE:
            raise ValueError(f"the native forward runs float32, bfloat16, int8 or int8-dynamic, not {precision}: "
                             f"convert with apply_precision(cp, 'float32') first")
        p0 = next(code_predictor.parameters())
        if p0.device.type != "cpu":
            raise ValueError(f"the native forward runs on the CPU; the code predictor is on {p0.device}: use "
                             f"--backend eager/compile/cuda there")
        cfg = code_predictor.config
        self.code_predictor, self.precision = code_predictor, precision
        self.dtype, self.device = p0.dtype if precision != "int8-dynamic" else torch.float32, p0.device
        self.cache_dtype = torch.float32
        self.fast = precision in C.fast_precisions()
        m = code_predictor.model
        self.decoder = PackedDecoder(m, cfg, precision)
        self.handle = self.decoder.handle  # the C model (an int), valid while this backend lives
        self.act_bf16 = self.decoder.act_bf16
        self.n_layers, self.n_heads, self.n_kv = self.decoder.n_layers, self.decoder.n_heads, self.decoder.n_kv
        self.head_dim, self.hidden = self.decoder.head_dim, self.decoder.hidden
        with torch.no_grad():
            self.heads = [packed_linear(precision, [h]) for h in code_predictor.lm_head]
            rot_dtype = torch.float32 if precision == "int8-dynamic" else p0.dtype
            cos, sin = m.rotary_emb(torch.zeros(1, dtype=rot_dtype), torch.arange(ROPE_POSITIONS)[None])
        self.cos, self.sin = cos[0].to(torch.float32).contiguous(), sin[0].to(torch.float32).contiguous()

    # -- the backend protocol (rvqspec_lib.decoding.predictor.VerifyBackend; the cache: SlotBackend's, float32) ----
    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, allow: torch.Tensor, cache: LeanCache,
                write_slots: torch.Tensor) -> torch.Tensor:
        """The verify call, as :func:`rvqspec_lib.decoding.predictor.verify_forward` (in the activation dtype)."""
        b, q_len, _ = embeds.shape
        s = cache.n_slots
        x = embeds.reshape(b * q_len, -1).to(torch.float32).contiguous()
        pos = positions.reshape(-1).clamp(0, ROPE_POSITIONS - 1)
        cos, sin = self.cos[pos].contiguous(), self.sin[pos].contiguous()
        al = allow.to(torch.uint8).contiguous()
        wr = write_slots.to(torch.int64).contiguous()
        if not (cache.k.is_contiguous() and cache.v.is_contiguous()):
            cache.k, cache.v = cache.k.contiguous(), cache.v.contiguous()
        out = torch.empty(b * q_len, self.hidden, dtype=torch.float32)
        rc = C.lib().rvq_forward(self.handle, C.ptr(x), C.ptr(cos), C.ptr(sin), C.ptr(al), C.ptr(wr),
                                 C.ptr(cache.k), C.ptr(cache.v), b, q_len, s, C.ptr(out))
        if rc != 0:
            raise MemoryError("the native forward could not allocate its scratch memory")
        return out.view(b, q_len, self.hidden).to(self.dtype)

    def frame_tables(self) -> list[torch.Tensor]:
        """The embedding tables a native frame reads: ``small_to_mtp_projection(codec_embedding[j - 1].weight)`` as
        float32 ``(V, H)`` for codes j = 1..n_codes - 1. Projected once, on the first call, and shared by every frame
        built over this backend (the auto stage builds one a candidate: a copy each was ``V x H x 4`` bytes per table
        per frame); a snapshot, like the packed weights."""
        if getattr(self, "_frame_tables", None) is None:
            cp = self.code_predictor
            proj, n = cp.small_to_mtp_projection, P.n_codes(cp)
            with torch.inference_mode():
                self._frame_tables = [proj(t.weight).to(torch.float32).contiguous()
                                      for t in list(cp.model.codec_embedding)[:max(n - 1, 0)]]
        return self._frame_tables

    def head(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """``lm_head[index]`` applied to ``hidden`` ``(N, H)`` through the C kernel: ``(N, V)`` in the activation
        dtype."""
        x = hidden.reshape(-1, self.hidden).to(torch.float32).contiguous()
        return self.heads[index](x, act_bf16=self.act_bf16).to(self.dtype)

    def logits(self, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """Head logits row by row, as :func:`rvqspec_lib.decoding.predictor.head_logits` (in the activation dtype)."""
        head = head.clamp(0, len(self.heads) - 1)
        first = int(head[0]) if head.numel() else 0
        if head.numel() and bool((head == first).all()):
            return self.head(first, hidden)
        out = torch.empty(hidden.shape[0], self.heads[0].n, dtype=self.dtype)
        for i in torch.unique(head).tolist():
            sel = head == i
            out[sel] = self.head(i, hidden[sel])
        return out

    def apply(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A linear layer of the code predictor applied to ``x`` ``(..., in)``: a per-depth head through the C kernel,
        any other layer through its own forward. Returns ``(..., out)`` in the activation dtype."""
        for i, h in enumerate(self.code_predictor.lm_head):
            if module is h:
                return self.head(i, x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        return module(x.to(self.dtype))

    def __repr__(self) -> str:
        return f"NativeCodePredictor(precision={self.precision!r}, fast={self.fast})"
