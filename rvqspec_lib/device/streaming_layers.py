"""Per-layer streaming state of the official 12 Hz speech tokenizer decoder (causal convolution tails, transposed
convolution overhangs, the transformer's sliding-window keys and values), in two backends over the SAME official
weights: ``official`` (the ``*State`` classes, the official modules, any device) and ``onednn`` (the ``Fast*``
classes, weights laid out once for oneDNN, CPU only). docs/codec_streaming.md explains both and why.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rvqspec_lib.device.kernels.snake import snake

_CL = torch.channels_last


def onednn_available() -> tuple[bool, str]:
    """Whether this torch has the oneDNN (mkldnn) CPU ops the backend needs: ``(ok, reason if not)``."""
    if not torch.backends.mkldnn.is_available():
        return False, "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if not hasattr(torch.ops.mkldnn, "_convolution_pointwise"):
        return False, "this torch has no torch.ops.mkldnn._convolution_pointwise"
    return True, ""


def check_codes_chunk(codes, n_codebooks: int, codebook_size: int, batch: int) -> torch.Tensor:
    """A checked chunk of codes ``(batch, n_codebooks, n >= 1)`` with ids in ``[0, codebook_size)``, as int64.

    Raises:
        ValueError: (one line naming the fix) another shape, non-integer codes, 0 frames, ids out of range.
    """
    if not isinstance(codes, torch.Tensor):
        codes = torch.as_tensor(codes)
    if codes.ndim != 3 or codes.shape[1] != n_codebooks:
        raise ValueError(f"codes must have shape (batch, {n_codebooks}, frames), got {tuple(codes.shape)}: pass all "
                         f"{n_codebooks} codebooks of each frame, codebook-major (codes.transpose(1, 2) turns "
                         "(batch, frames, codebooks) around)")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise ValueError(f"codes must be integers, got dtype {codes.dtype}: pass int64 code ids")
    if codes.shape[2] == 0:
        raise ValueError("a chunk of 0 frames: push at least one frame (call flush() to end a stream)")
    lo, hi = int(codes.min()), int(codes.max())
    if lo < 0 or hi >= codebook_size:
        raise ValueError(f"code ids must lie in [0, {codebook_size}), got range [{lo}, {hi}]: strip special ids "
                         "(pad, bos, eos >= 2048) before decoding")
    if codes.shape[0] != batch:
        raise ValueError(f"codes of batch {codes.shape[0]} pushed to a stream of batch {batch}: call "
                         f"reset(batch_size={codes.shape[0]}) first")
    return codes.long()


def window_mask(cached: int, n: int, window: int | None, dtype, device) -> torch.Tensor | None:
    """The official sliding-window causal mask, additive ``(1, 1, n, cached + n)``, for n new frames after ``cached``
    ones; ``None`` for one new frame (it sees the whole cache)."""
    if n == 1:
        return None
    q = torch.arange(n, device=device)[:, None] + cached  # query positions, counted from the oldest cached key
    k = torch.arange(cached + n, device=device)[None, :]
    ok = k <= q
    if window is not None:
        ok &= k > q - window
    return torch.zeros(ok.shape, dtype=dtype, device=device).masked_fill_(~ok, torch.finfo(dtype).min)[None, None]


def _causal_context(module: nn.Module) -> int:
    """The left context ``(kernel - 1) * dilation`` of an official ``Qwen3TTSTokenizerV2CausalConvNet`` (its
    ``kernel_size`` is the effective one); only stride 1 streams."""
    if module.stride != 1:
        raise ValueError(f"a causal convolution of stride {module.stride}: only stride 1 streams here")
    return int(module.kernel_size) - 1


def _trans_overhang(module: nn.Module) -> tuple[int, int]:
    """``(stride, kernel - stride)`` of an official ``Qwen3TTSTokenizerV2CausalTransConvNet``."""
    conv = module.conv
    stride = int(conv.stride[0])
    overhang = int(conv.kernel_size[0]) - stride
    if overhang != module.right_pad or conv.padding[0] or conv.output_padding[0] or conv.dilation[0] != 1:
        raise ValueError("a transposed convolution not of the official causal form (kernel - stride trimmed on "
                         "the right, no padding, no dilation)")
    return stride, overhang


class CausalConvState:
    """The left context of one official ``Qwen3TTSTokenizerV2CausalConvNet`` (stride 1): its last
    ``(kernel_size - 1) * dilation`` input samples, zeros at the start of a stream (the official left zero padding)."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.context = _causal_context(module)
        self.buf: torch.Tensor | None = None

    def reset(self, batch_size: int, dtype: torch.dtype, device) -> None:
        c = self.module.conv.in_channels
        self.buf = torch.zeros(batch_size, c, self.context, dtype=dtype, device=device) if self.context else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, T) -> (B, C_out, T)
        if self.buf is None:
            return self.module.conv(x)
        xc = torch.cat([self.buf, x], -1)  # (B, C_in, context + T)
        self.buf = xc[..., xc.shape[-1] - self.context:]
        return self.module.conv(xc)


class TransConvState:
    """One official ``Qwen3TTSTokenizerV2CausalTransConvNet`` (kernel K, stride s): the ``K - s`` outputs it trims are
    this chunk's contributions to the next chunk's first ``K - s`` samples, carried and added there (overlap-add)."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.stride, self.overhang = _trans_overhang(module)
        self.tail: torch.Tensor | None = None

    def reset(self, batch_size: int, dtype: torch.dtype, device) -> None:
        c = self.module.conv.out_channels
        self.tail = torch.zeros(batch_size, c, self.overhang, dtype=dtype, device=device) if self.overhang else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, n) -> (B, C_out, n * stride)
        conv = self.module.conv
        if self.tail is None:
            return conv(x)
        y = F.conv_transpose1d(x, conv.weight, None, stride=self.stride)  # (B, C_out, n * s + overhang)
        n_out = x.shape[-1] * self.stride
        y[..., : self.overhang] += self.tail
        self.tail = y[..., n_out:]
        out = y[..., :n_out]
        return out if conv.bias is None else out + conv.bias[:, None]


class ConvNeXtState:
    """One official ``Qwen3TTSTokenizerV2ConvNeXtBlock`` with its causal depthwise convolution streamed; the rest of
    the block (LayerNorm, the two pointwise layers, GELU, gamma, the residual) acts on each sample alone."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.dwconv = CausalConvState(module.dwconv)

    def reset(self, batch_size, dtype, device):
        self.dwconv.reset(batch_size, dtype, device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T)
        m = self.module
        h = self.dwconv(x).permute(0, 2, 1)  # (B, T, C)
        h = m.pwconv2(m.act(m.pwconv1(m.norm(h))))
        return x + (m.gamma * h).permute(0, 2, 1)


class WindowKV:
    """The transformer's key/value cache of the last ``window - 1`` frames per layer, with the ``update`` method the
    official attention calls."""

    def __init__(self, n_layers: int, window: int | None):
        self.keep = None if window is None else int(window) - 1
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    def cached(self) -> int:
        k = self.keys[0]
        return 0 if k is None else int(k.shape[-2])

    def update(self, key, value, layer_idx, cache_kwargs=None):  # (B, H, n, D) each
        if self.keys[layer_idx] is not None:
            key = torch.cat([self.keys[layer_idx], key], -2)
            value = torch.cat([self.values[layer_idx], value], -2)
        keep = key.shape[-2] if self.keep is None else min(self.keep, key.shape[-2])
        self.keys[layer_idx] = key[:, :, key.shape[-2] - keep:]
        self.values[layer_idx] = value[:, :, value.shape[-2] - keep:]
        return key, value


class TransformerState:
    """The official ``pre_transformer``'s own modules run on a chunk of frames with a :class:`WindowKV` cache, the
    positions continuing from chunk to chunk."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.window = getattr(module.config, "sliding_window", None)
        self.reset()

    def reset(self, batch_size=None, dtype=None, device=None):
        """An empty window, frame positions back to 0."""
        self.kv = WindowKV(len(self.module.layers), self.window)
        self.position = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, latent) -> (B, n, latent)
        m = self.module
        n = x.shape[1]
        h = m.input_proj(x)
        positions = torch.arange(self.position, self.position + n, device=x.device)
        position_ids = positions[None]
        cos_sin = m.rotary_emb(h, position_ids)
        mask = window_mask(self.kv.cached(), n, self.window, h.dtype, h.device)
        for layer in m.layers:
            h = layer(h, attention_mask=mask, position_ids=position_ids, past_key_values=self.kv, use_cache=True,
                      cache_position=positions, position_embeddings=cos_sin)
        self.position += n
        return m.output_proj(m.norm(h))


class ResidualUnitState:
    """One official ``Qwen3TTSTokenizerV2DecoderDecoderResidualUnit``: SnakeBeta, the dilated causal convolution
    (streamed), SnakeBeta, the 1x1 convolution, the residual."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.conv1 = CausalConvState(module.conv1)

    def reset(self, batch_size, dtype, device):
        self.conv1.reset(batch_size, dtype, device)

    def __call__(self, x):  # (B, C, T)
        m = self.module
        return m.conv2.conv(m.act2(self.conv1(m.act1(x)))) + x


def to_cl(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, T)`` -> ``(B, C, 1, T)`` channels-last (time-major in memory)."""
    return x.unsqueeze(2).contiguous(memory_format=_CL)


class FastConv:
    """A causal convolution (official ``Qwen3TTSTokenizerV2CausalConvNet``, stride 1, any groups) on channels-last
    ``(B, C, 1, T)`` activations with a prepacked weight; its left context carried as in the official backend."""

    def __init__(self, module: nn.Module, t_hint: int):
        conv = module.conv
        self.context = _causal_context(module)
        self.dilation = int(conv.dilation[0])
        self.groups = int(conv.groups)
        self.in_channels = int(conv.in_channels)
        w = conv.weight.detach().unsqueeze(2).contiguous(memory_format=_CL)  # (C_out, C_in / groups, 1, k)
        self.weight = torch.ops.mkldnn._reorder_convolution_weight(
            w, [0, 0], [1, 1], [1, self.dilation], self.groups, [1, self.in_channels, 1, t_hint + self.context])
        self.bias = None if conv.bias is None else conv.bias.detach()
        self.buf: torch.Tensor | None = None

    def reset(self, batch_size: int, dtype, device) -> None:
        self.buf = (torch.zeros(batch_size, self.in_channels, 1, self.context, dtype=dtype, device=device)
                    .contiguous(memory_format=_CL) if self.context else None)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, C_in, 1, T)`` -> ``(B, C_out, 1, T)``, plus ``residual`` (added by oneDNN) when given."""
        if self.buf is not None:
            x = torch.cat([self.buf, x], 3)  # (B, C_in, 1, context + T)
            self.buf = x[..., x.shape[-1] - self.context:]
        x = x.contiguous(memory_format=_CL)
        conv = torch.ops.mkldnn._convolution_pointwise
        if residual is None:
            return conv(x, self.weight, self.bias, [0, 0], [1, 1], [1, self.dilation], self.groups, "none", [], "")
        return conv.binary(x, residual.contiguous(memory_format=_CL), self.weight, self.bias, [0, 0], [1, 1],
                           [1, self.dilation], self.groups, "add", None, None, [], None)


class FastTransConv:
    """A causal transposed convolution (official ``Qwen3TTSTokenizerV2CausalTransConvNet``) with a prepacked weight;
    the ``kernel - stride`` overhang carried and added to the next chunk (overlap-add). The bias is applied by
    oneDNN to every output, so the carried overhang has it taken off once."""

    def __init__(self, module: nn.Module, t_hint: int):
        conv = module.conv
        self.stride, self.overhang = _trans_overhang(module)
        self.out_channels = int(conv.out_channels)
        w = conv.weight.detach().unsqueeze(2).contiguous(memory_format=_CL)  # (C_in, C_out, 1, K)
        self.weight = torch.ops.mkldnn._reorder_convolution_transpose_weight(
            w, [0, 0], [0, 0], [1, self.stride], [1, 1], 1, [1, int(conv.in_channels), 1, t_hint])
        self.bias = None if conv.bias is None else conv.bias.detach()
        self.tail: torch.Tensor | None = None

    def reset(self, batch_size: int, dtype, device) -> None:
        self.tail = (torch.zeros(batch_size, self.out_channels, 1, self.overhang, dtype=dtype, device=device)
                     if self.overhang else None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, 1, n) -> (B, C_out, 1, n * stride)
        y = torch.ops.mkldnn._convolution_transpose_pointwise(
            x.contiguous(memory_format=_CL), self.weight, self.bias, [0, 0], [0, 0], [1, self.stride], [1, 1], 1,
            "none", [], "")  # (B, C_out, 1, n * stride + overhang)
        if self.tail is None:
            return y
        n_out = x.shape[-1] * self.stride
        y[..., : self.overhang] += self.tail
        tail = y[..., n_out:]
        self.tail = tail if self.bias is None else tail - self.bias[:, None, None]
        return y[..., :n_out]


class FastLinear:
    """``y = x @ W.T + b`` by oneDNN with a prepacked weight: ``W`` one official ``nn.Linear``'s, or several stacked
    along the output dimension so that one matmul serves them; ``row_scale`` (a per-output-channel factor, e.g. an
    official layer scale) folded into ``W`` and ``b`` once. ``__call__`` takes a fused oneDNN activation (``attr``
    ``"gelu"``); :meth:`add` fuses a residual: ``x @ W.T + b + other``."""

    def __init__(self, linears: list[nn.Module], rows_hint: int, row_scale: torch.Tensor | None = None):
        w = torch.cat([lin.weight.detach() for lin in linears], 0)
        biases = [lin.bias for lin in linears]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else torch.zeros(lin.out_features, dtype=w.dtype, device=w.device)
             for b, lin in zip(biases, linears)])
        if row_scale is not None:
            w = (w.float() * row_scale.detach().float()[:, None]).to(w.dtype)
            bias = None if bias is None else (bias.float() * row_scale.detach().float()).to(w.dtype)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w, rows_hint)
        self.bias = bias

    def __call__(self, x: torch.Tensor, attr: str = "none", algorithm: str = "") -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, attr, [], algorithm)

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.weight, self.bias, "add")


class FastSnake:
    """The official ``SnakeBeta`` ``x + sin(x * e^alpha)^2 / (e^beta + 1e-9)`` on channels-last activations: its two
    per-channel factors computed once from the official parameters (float32), the function by the fused kernel
    :func:`rvqspec_lib.device.kernels.snake.snake` (one pass over memory instead of five)."""

    def __init__(self, module: nn.Module):
        with torch.no_grad():
            self.alpha = torch.exp(module.alpha.detach().float()).contiguous()
            self.inv_beta = (1.0 / (torch.exp(module.beta.detach().float()) + module.no_div_by_zero)).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, 1, T) channels-last
        return snake(x, self.alpha, self.inv_beta)


class FastQuantizer:
    """The official ``SplitResidualVectorQuantizer.decode``: codes ``(B, 16, n)`` -> ``(B, codebook_dim, n)``, each
    codebook's table computed once (the official ``decode`` recomputes them every call)."""

    def __init__(self, quantizer: nn.Module):
        self.q = quantizer
        self.n_first = int(quantizer.n_q_semantic)
        with torch.no_grad():
            tables = [layer._codebook for rvq in (quantizer.rvq_first, quantizer.rvq_rest) for layer in rvq.vq.layers]
            self.tables = torch.stack([cb.embedding_sum / cb.cluster_usage.clamp(min=cb.epsilon)[:, None]
                                       for cb in tables])  # (n_codebooks, codebook_size, dim)
        for rvq in (quantizer.rvq_first, quantizer.rvq_rest):
            if any(not isinstance(layer.project_out, nn.Identity) for layer in rvq.vq.layers):
                raise ValueError("a codebook with its own projection: not the released quantizer's form")

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:  # (B, K, n) int64 -> (B, codebook_dim, n)
        k = codes.shape[1]
        rows = self.tables[torch.arange(k, device=codes.device)[None, :, None], codes]  # (B, K, n, dim)
        first = rows[:, : self.n_first].sum(1).transpose(1, 2)  # (B, dim, n)
        out = self.q.rvq_first.output_proj(first)
        if k > self.n_first:
            out = out + self.q.rvq_rest.output_proj(rows[:, self.n_first:].sum(1).transpose(1, 2))
        return out


class FastConvNeXt:
    """One official ``Qwen3TTSTokenizerV2ConvNeXtBlock``: the causal depthwise convolution streamed and prepacked,
    the official LayerNorm, the two pointwise layers prepacked (GELU fused into the first by oneDNN: the official
    ``nn.GELU()``, exact erf), gamma and the residual."""

    def __init__(self, module: nn.Module, t_hint: int):
        self.module = module
        self.dwconv = FastConv(module.dwconv, t_hint)
        self.pw1 = FastLinear([module.pwconv1], t_hint)
        self.pw2 = FastLinear([module.pwconv2], t_hint)

    def reset(self, batch_size, dtype, device):
        self.dwconv.reset(batch_size, dtype, device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, 1, T) channels-last
        m = self.module
        h = self.dwconv(x).permute(0, 2, 3, 1)  # (B, 1, T, C), a view of the channels-last memory
        h = self.pw2(self.pw1(m.norm(h), "gelu", "none"))
        return x + (m.gamma * h).permute(0, 3, 1, 2)


class FastResidualUnit:
    """One official ``Qwen3TTSTokenizerV2DecoderDecoderResidualUnit``: SnakeBeta, the dilated causal convolution
    (streamed, prepacked), SnakeBeta, the 1x1 convolution (prepacked) with the residual added by oneDNN."""

    def __init__(self, module: nn.Module, t_hint: int):
        self.act1, self.act2 = FastSnake(module.act1), FastSnake(module.act2)
        self.conv1 = FastConv(module.conv1, t_hint)
        self.conv2 = FastConv(module.conv2, t_hint)

    def reset(self, batch_size, dtype, device):
        self.conv1.reset(batch_size, dtype, device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, 1, T) channels-last
        return self.conv2(self.act2(self.conv1(self.act1(x))), residual=x)


class FastTransformer:
    """The official ``pre_transformer`` on a chunk of frames with a :class:`WindowKV` cache, its linear layers
    prepacked (q/k/v and gate/up each one matmul, the layer scales folded in, the residuals added by oneDNN), the
    layer's steps in the official order, attention the official eager one (softmax in float32)."""

    def __init__(self, module: nn.Module, rows_hint: int):
        self.module = module
        self.input_proj = FastLinear([module.input_proj], rows_hint)
        self.output_proj = FastLinear([module.output_proj], rows_hint)
        self.layers = []
        for layer in module.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(dict(
                norm1=(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                norm2=(layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                qkv=FastLinear([a.q_proj, a.k_proj, a.v_proj], rows_hint),
                o=FastLinear([a.o_proj], rows_hint, layer.self_attn_layer_scale.scale),
                gate_up=FastLinear([m.gate_proj, m.up_proj], rows_hint),
                down=FastLinear([m.down_proj], rows_hint, layer.mlp_layer_scale.scale),
                act=m.act_fn))
        a = module.layers[0].self_attn
        self.n_q, self.n_kv = int(a.config.num_attention_heads), int(a.config.num_key_value_heads)
        self.head_dim, self.scaling = int(a.head_dim), float(a.scaling)
        self.hidden = int(module.config.hidden_size)
        self.window = getattr(module.config, "sliding_window", None)
        self.reset()

    reset = TransformerState.reset

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, latent) -> (B, n, latent)
        m = self.module
        b, n, _ = x.shape
        n_q, n_kv, d = self.n_q, self.n_kv, self.head_dim
        h = self.input_proj(x)  # (B, n, hidden)
        positions = torch.arange(self.position, self.position + n, device=x.device)
        cos, sin = m.rotary_emb(h, positions[None])  # (1, n, d) each
        cos, sin = cos[:, None], sin[:, None]
        mask = window_mask(self.kv.cached(), n, self.window, h.dtype, h.device)
        shape = (self.hidden,)
        for i, p in enumerate(self.layers):
            qkv = p["qkv"](F.rms_norm(h, shape, *p["norm1"]))  # (B, n, (n_q + 2 n_kv) d)
            qk = qkv[..., : (n_q + n_kv) * d].view(b, n, n_q + n_kv, d).transpose(1, 2)  # (B, Hq + Hk, n, d)
            qk = qk * cos + torch.cat((-qk[..., d // 2:], qk[..., : d // 2]), -1) * sin  # official rotate_half
            v = qkv[..., (n_q + n_kv) * d:].view(b, n, n_kv, d).transpose(1, 2)  # (B, Hk, n, d)
            k, v = self.kv.update(qk[:, n_q:], v, i)
            if n_q != n_kv:  # grouped-query attention: each key/value head serves n_q / n_kv query heads
                k, v = k.repeat_interleave(n_q // n_kv, 1), v.repeat_interleave(n_q // n_kv, 1)
            # the official eager attention (softmax in float32): for a few queries over at most 72 keys it is 3-4x
            # cheaper than torch's CPU flash-attention kernel, whose fixed cost dominates at these sizes
            w = torch.matmul(qk[:, :n_q], k.transpose(2, 3)) * self.scaling  # (B, Hq, n, keys)
            if mask is not None:
                w = w + mask
            o = torch.matmul(torch.softmax(w, -1, dtype=torch.float32).to(v.dtype), v)  # (B, Hq, n, d)
            h = p["o"].add(o.transpose(1, 2).reshape(b, n, n_q * d), h)
            gate, up = p["gate_up"](F.rms_norm(h, shape, *p["norm2"])).chunk(2, -1)
            h = p["down"].add(p["act"](gate) * up, h)
        self.position += n
        return self.output_proj(m.norm(h))
