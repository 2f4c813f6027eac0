"""Stateful streaming decoding of the 12 Hz speech tokenizer, each chunk costing only its own frames' compute: the
official decoder is causal, so carrying each layer's state (:mod:`rvqspec_lib.device.streaming_layers`) decodes a
stream exactly, unlike the official ``chunked_decode``. :func:`rvqspec_lib.models.speech_tokenizers.streaming_decoder` gives
every codec of the project the same interface. docs/codec_streaming.md explains both.
"""

from __future__ import annotations

import torch
from torch import nn

from rvqspec_lib.device.kernels.build import note_slower
from rvqspec_lib.device.streaming_layers import (
    CausalConvState,
    ConvNeXtState,
    FastConv,
    FastConvNeXt,
    FastQuantizer,
    FastResidualUnit,
    FastSnake,
    FastTransConv,
    FastTransformer,
    ResidualUnitState,
    TransConvState,
    TransformerState,
    check_codes_chunk,
    onednn_available,
    to_cl,
)
from rvqspec_lib.device.streaming_rvq import StreamingRVQDecoder, check_active


#: Backends of :class:`StreamingCodecDecoder` (rvqspec_lib.device.streaming_layers: same state, same weights).
BACKENDS = ("auto", "official", "onednn")


class StreamingCodecDecoder:
    """Stateful streaming decoder over an official 12 Hz speech tokenizer decoder (``Qwen3TTSTokenizerV2Decoder``):
    push codes chunk by chunk, get each chunk's audio at once (no look-ahead: the decoder is causal).

    Args:
        decoder: the official module (``Qwen3TTSTokenizer.model.decoder``, or
            :func:`rvqspec_lib.models.configs.build_codec_decoder`), float32 or bfloat16 (the stream runs in its
            dtype), any device; used as is, its weights unchanged during a stream.
        batch_size: rows of the first stream.
        backend: ``"official"`` (any device), ``"onednn"`` (CPU only, the fast one) or ``"auto"`` (``onednn``
            where it runs, else ``official``).
        chunk_frames_hint: the chunk size the ``onednn`` weights are laid out for (any chunk size works).
    Raises:
        ValueError: an unknown backend, or ``onednn`` where it cannot run (one line, naming the fix).

    Attributes: ``frames`` (pushed since the last :meth:`reset`), ``n_codebooks``, ``codebook_size``,
    ``frame_samples``, ``sample_rate``, ``lookahead_frames`` (0), ``first_audio_frames`` (1), ``backend``.
    """

    lookahead_frames = 0
    first_audio_frames = 1
    sample_rate = 24000

    def __init__(self, decoder: nn.Module, batch_size: int = 1, *, backend: str = "auto",
                 chunk_frames_hint: int = 1):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
        p = next(decoder.parameters())
        ok, why = onednn_available()
        if backend == "auto":
            backend = "onednn" if ok and p.device.type == "cpu" else "official"
            if not ok and p.device.type == "cpu":
                note_slower("the streaming codec decoder's oneDNN backend", f"{why}; the official modules decode the "
                            "stream (a torch build with oneDNN, as pinned in requirements.txt, brings it back)")
        if backend == "onednn" and (not ok or p.device.type != "cpu"):
            raise ValueError(f"backend 'onednn' cannot run here ({why or 'the decoder is on ' + str(p.device)}): "
                             "use backend='official'")
        cfg = decoder.config
        self.decoder, self.backend = decoder, backend
        self.n_codebooks = int(cfg.num_quantizers)
        self.codebook_size = int(cfg.codebook_size)
        self.frame_samples = int(decoder.total_upsample)
        blocks = decoder.decoder
        if backend == "official":
            self.quantizer = decoder.quantizer.decode
            self.pre_conv = CausalConvState(decoder.pre_conv)
            self.transformer = TransformerState(decoder.pre_transformer)
            self.upsample = [(TransConvState(tc), ConvNeXtState(cnx)) for tc, cnx in decoder.upsample]
            self.first_conv = CausalConvState(blocks[0])
            self.blocks = [(b.block[0], TransConvState(b.block[1]), [ResidualUnitState(u) for u in b.block[2:]])
                           for b in blocks[1:-2]]
            self.last_act, self.last_conv = blocks[-2], CausalConvState(blocks[-1])
        else:
            with torch.no_grad():
                self.quantizer = FastQuantizer(decoder.quantizer)
                t = int(chunk_frames_hint)  # samples a chunk has at each stage, for the weight layouts
                self.pre_conv = FastConv(decoder.pre_conv, t)
                self.transformer = FastTransformer(decoder.pre_transformer, t)
                self.upsample = []
                for tc, cnx in decoder.upsample:
                    self.upsample.append((FastTransConv(tc, t), FastConvNeXt(cnx, t * int(tc.conv.stride[0]))))
                    t *= int(tc.conv.stride[0])
                self.first_conv = FastConv(blocks[0], t)
                self.blocks = []
                for b in blocks[1:-2]:
                    tc = FastTransConv(b.block[1], t)
                    t *= tc.stride
                    self.blocks.append((FastSnake(b.block[0]), tc, [FastResidualUnit(u, t) for u in b.block[2:]]))
                self.last_act, self.last_conv = FastSnake(blocks[-2]), FastConv(blocks[-1], t)
        self._stages = self.stages()
        self.batch_size = 0
        self.frames = 0
        self.reset(batch_size)

    def _states(self):
        yield self.pre_conv
        yield self.transformer
        for tc, cnx in self.upsample:
            yield tc
            yield cnx
        yield self.first_conv
        for _, tc, units in self.blocks:
            yield tc
            yield from units
        yield self.last_conv

    def reset(self, batch_size: int = 1) -> None:
        """Start a fresh stream of ``batch_size`` rows (states zeroed, positions at 0); ValueError below 1."""
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        p = next(self.decoder.parameters())
        self.batch_size, self.frames = int(batch_size), 0
        for s in self._states():
            s.reset(self.batch_size, p.dtype, p.device)

    @torch.no_grad()
    def push(self, codes, active=None) -> torch.Tensor:
        """Decode ``codes`` ``(batch_size, 16, n)`` integer ids in ``[0, 2048)``, n >= 1 new frames, into
        ``(batch_size, n * 1920)`` float32 audio in [-1, 1] at 24 kHz: the official ``forward``'s samples of these
        frames, up to float rounding. ``active``: ``(batch_size, n)`` bool, default all True; a row's frames from
        its first False on are silence (the decoder is causal: what follows a row's end changes none of its audio).
        ValueError (one line): codes :func:`check_codes_chunk` refuses, or a bad ``active``
        (:func:`~rvqspec_lib.device.streaming_rvq.check_active`)."""
        codes = check_codes_chunk(codes, self.n_codebooks, self.codebook_size, self.batch_size)
        active = check_active(active, self.batch_size, codes.shape[2])
        h = codes.to(next(self.decoder.parameters()).device)
        for _, stage in self._stages:
            h = stage(h)
        self.frames += codes.shape[2]
        if active is not None:
            h = h * active.to(h.device).repeat_interleave(self.frame_samples, 1)
        return h

    def stages(self) -> list[tuple[str, object]]:
        """The ``(name, function)`` stages :meth:`push` composes, for per-stage timing: ``rvq+pre_conv``,
        ``transformer``, ``upsample``, ``conv_in``, ``block0`` .. ``block3``, ``conv_out``."""
        official = self.backend == "official"

        def front(codes):
            h = self.quantizer(codes)  # (B, codebook_dim, n)
            return self.pre_conv(h) if official else self.pre_conv(to_cl(h))  # (B, latent, [1,] n)

        def transformer(h):
            if official:
                return self.transformer(h.transpose(1, 2)).permute(0, 2, 1)  # (B, latent, n)
            return to_cl(self.transformer(h.permute(0, 2, 3, 1)[:, 0]).transpose(1, 2))  # (B, latent, 1, n)

        def upsample(h):
            for tc, cnx in self.upsample:
                h = cnx(tc(h))
            return h

        def block(act, tc, units):
            def run(h):
                h = tc(act(h))
                for u in units:
                    h = u(h)
                return h
            return run

        def back(h):
            wav = self.last_conv(self.last_act(h)).clamp(min=-1, max=1)  # (B, 1, [1,] n * frame_samples)
            return wav.reshape(wav.shape[0], -1).float()

        return ([("rvq+pre_conv", front), ("transformer", transformer), ("upsample", upsample),
                 ("conv_in", self.first_conv)]
                + [(f"block{i}", block(*b)) for i, b in enumerate(self.blocks)] + [("conv_out", back)])

    @property
    def emitted(self) -> int:
        """Frames whose audio has been returned: all pushed frames (no look-ahead)."""
        return self.frames

    def flush(self) -> torch.Tensor:
        """End of stream: the audio still held back. None is (no look-ahead): ``(batch_size, 0)`` float32."""
        return torch.zeros(self.batch_size, 0)
