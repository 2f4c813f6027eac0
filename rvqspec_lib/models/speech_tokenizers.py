"""Speech tokenizers (codes <-> audio) behind one interface: :class:`Qwen12HzCodec` wraps the official 12 Hz tokenizer
(for users with its weights), :class:`CodecSpeechTokenizer` gives the offline
:class:`~rvqspec_lib.models.rvq_codec.RVQCodec` the official ``decode`` interface, so our own models turn codes into
audio as real checkpoints do.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np
import torch

from rvqspec_lib.models.audio import (
    FRAME_RATE_HZ,
    FRAME_SAMPLES,
    SAMPLE_RATE,
    _check_wav,
)
from rvqspec_lib.models.rvq_codec import RVQCodec, _check_codes
from rvqspec_lib.models.shim import import_qwen_tts
from rvqspec_lib.device.streaming_codec import StreamingCodecDecoder
from rvqspec_lib.device.streaming_layers import onednn_available
from rvqspec_lib.device.streaming_rvq import StreamingRVQDecoder


class CodecSpeechTokenizer:
    """The official speech tokenizer's ``decode`` interface over an :class:`~rvqspec_lib.models.rvq_codec.RVQCodec`."""

    def __init__(self, codec):
        self.codec = codec
        self.sample_rate = int(codec.config.sample_rate)

    def decode(self, items) -> tuple[list, int]:
        """``items``: dicts with ``"audio_codes"`` ``(frames, n_codebooks)`` int (or the codes themselves) -> a list
        of float32 waveforms and the sample rate."""
        wavs = []
        for it in items:
            codes = it["audio_codes"] if isinstance(it, dict) else it
            codes = codes.detach().cpu().numpy() if isinstance(codes, torch.Tensor) else codes
            wavs.append(self.codec.decode(codes))
        return wavs, self.sample_rate


class Qwen12HzCodec:
    """The official Qwen3-TTS 12 Hz speech tokenizer behind the :class:`RVQCodec` interface.

    Args:
        path: a local tokenizer folder (``Qwen/Qwen3-TTS-Tokenizer-12Hz`` downloaded, or a checkpoint's
            ``speech_tokenizer/``), or a hub id. device: torch device. **kwargs: for ``from_pretrained``.

    Raises:
        FileNotFoundError: a local path that does not exist, or a hub id that cannot be fetched.
    """

    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES
    frame_rate_hz = FRAME_RATE_HZ
    n_codebooks = 16
    codebook_size = 2048

    def __init__(self, path: str | os.PathLike, device: str = "cpu", **kwargs):
        name = str(path)
        p = Path(name).expanduser()
        hub_like = not p.exists() and name.count("/") == 1 and not name.startswith((".", "/", "~"))
        if not p.exists() and not hub_like:
            raise FileNotFoundError(
                f"no speech tokenizer at {name}: download it where the network is reachable "
                "(huggingface-cli download Qwen/Qwen3-TTS-Tokenizer-12Hz --local-dir DIR) and pass DIR, or pass the "
                "speech_tokenizer/ folder of a Qwen3-TTS checkpoint. Offline, use "
                "rvqspec_lib.models.rvq_codec.RVQCodec.")
        qwen_tts = import_qwen_tts()
        try:
            self.tokenizer = qwen_tts.Qwen3TTSTokenizer.from_pretrained(str(p) if p.exists() else name,
                                                                         device_map=device, **kwargs)
        except OSError as e:
            raise FileNotFoundError(
                f"could not load the speech tokenizer {name!r} ({e.__class__.__name__}: "
                f"{str(e).splitlines()[0][:200] if str(e) else ''}). Offline, download it first and pass the local "
                "folder, or use rvqspec_lib.models.rvq_codec.RVQCodec.") from e
        self.sample_rate = int(self.tokenizer.get_input_sample_rate())
        self.frame_samples = int(self.tokenizer.get_encode_downsample_rate())
        self.frame_rate_hz = self.sample_rate / self.frame_samples
        cfg = self.tokenizer.config
        self.n_codebooks = int(getattr(cfg, "encoder_valid_num_quantizers", None) or self.n_codebooks)
        dec = getattr(cfg, "decoder_config", None)
        size = dec.get("codebook_size") if isinstance(dec, dict) else getattr(dec, "codebook_size", None)
        self.codebook_size = int(size or self.codebook_size)

    def encode(self, wav: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """`(samples,)` float audio at ``sample_rate`` -> `(frames, 16)` int64 codes."""
        wav = _check_wav(wav, sample_rate, self.sample_rate)
        enc = self.tokenizer.encode(wav, sr=self.sample_rate)
        return enc.audio_codes[0].detach().cpu().numpy().astype(np.int64)

    def decode(self, codes, n_codebooks: int | None = None) -> np.ndarray:
        """`(frames, 16)` codes -> `(samples,)` float32 audio at 24 kHz (all 16 codebooks: ``n_codebooks`` < 16
        raises ``ValueError``)."""
        codes = _check_codes(codes, self.n_codebooks, self.codebook_size)
        if n_codebooks not in (None, self.n_codebooks):
            raise ValueError(f"the official 12 Hz decoder needs all {self.n_codebooks} codebooks, got "
                             f"n_codebooks={n_codebooks}")
        return decode_audio(self.tokenizer, codes)[0]


def load_codec(name_or_path: str | os.PathLike, device: str = "cpu"):
    """An :class:`RVQCodec` for a ``.safetensors`` file or a folder holding ``codec.safetensors``; a
    :class:`Qwen12HzCodec` for anything else (a tokenizer folder or a hub id)."""
    p = Path(name_or_path).expanduser()
    if p.suffix == ".safetensors" or (p / "codec.safetensors").is_file():
        return RVQCodec.load(p)
    return Qwen12HzCodec(name_or_path, device=device)


#: Attributes through which a codec object holds the official 12 Hz decoder, tried in this order: ``Qwen12HzCodec``
#: -> ``Qwen3TTSTokenizer`` (``tokenizer``), a model -> its ``speech_tokenizer``, ``Qwen3TTSTokenizer`` ->
#: ``Qwen3TTSTokenizerV2Model`` (``model``) -> ``Qwen3TTSTokenizerV2Decoder`` (``decoder``).
_HOLDERS = ("tokenizer", "speech_tokenizer", "model", "decoder")


def official_decoder(codec):
    """The official 12 Hz decoder module (``Qwen3TTSTokenizerV2Decoder``) inside ``codec``: the decoder itself, a
    ``Qwen3TTSTokenizerV2Model``, the ``Qwen3TTSTokenizer`` a checkpoint loads as ``speech_tokenizer``, a
    :class:`Qwen12HzCodec`, or a model holding one; ``None`` when there is none (another codec)."""
    obj = codec
    for _ in range(len(_HOLDERS) + 1):
        if hasattr(obj, "pre_transformer"):
            return obj
        obj = next((h for h in (getattr(obj, a, None) for a in _HOLDERS) if h is not None), None)
        if obj is None:
            return None
    return None


def streaming_decoder(codec, batch_size: int = 1, **kwargs):
    """A streaming decoder (``reset``, ``push(codes (B, 16, n)) -> (B, m * 1920)``, ``flush``, ``lookahead_frames``,
    ``first_audio_frames``)
    for ``codec``: the official 12 Hz decoder, or anything holding one (:func:`official_decoder`: a checkpoint's
    ``speech_tokenizer``, a ``Qwen12HzCodec``) -> :class:`StreamingCodecDecoder` (exact, m = n, in the decoder's
    dtype and on its device); an :class:`RVQCodec` or ``CodecSpeechTokenizer`` ->
    :class:`~rvqspec_lib.device.streaming_rvq.StreamingRVQDecoder` (3 frames of look-ahead by default, the first audio after 2 frames). ``kwargs``
    go to the class chosen. ValueError (one line): anything else."""
    if isinstance(codec, RVQCodec) or isinstance(getattr(codec, "codec", None), RVQCodec):
        return StreamingRVQDecoder(codec, batch_size, **kwargs)
    dec = official_decoder(codec)
    if dec is None:
        raise ValueError(f"no streaming decoder for a {type(codec).__name__}: pass the official 12 Hz decoder, a "
                         "Qwen3TTSTokenizer, a Qwen12HzCodec, an RVQCodec or a CodecSpeechTokenizer")
    return StreamingCodecDecoder(dec, batch_size, **kwargs)


#: Frames a CPU decode of the official 12 Hz codec pushes through :class:`StreamingCodecDecoder` at once
#: (:func:`decode_audio`): on the released config with random weights, 2-core Zen 4, 200 frames, one thread, its
#: time was flat from 5 to 25 frames a chunk and its peak memory grows with the chunk (docs/model.md#device-and-dtype).
DECODE_CHUNK_FRAMES = 8


#: The stream :func:`decode_audio` keeps for each official decoder (held while the decoder lives).
_DECODE_STREAMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def decode_audio(codec, codes) -> tuple[np.ndarray, int]:
    """One utterance's codes to audio through a speech tokenizer's own decoder.

    Args:
        codec: a checkpoint's ``speech_tokenizer`` (the official ``Qwen3TTSTokenizer``), a :class:`Qwen12HzCodec`,
            or :class:`CodecSpeechTokenizer` (the official ``decode([{"audio_codes": ...}])`` interface).
        codes: ``(frames, 16)`` integer ids (a tensor or an array), frames >= 1.

    Returns:
        ``(audio, sample_rate)``: ``(frames * frame_samples,)`` float32 in [-1, 1], and its rate in Hz.

    The official 12 Hz decoder on a CPU with oneDNN is run as a stream of :data:`DECODE_CHUNK_FRAMES`-frame chunks
    (:class:`StreamingCodecDecoder`, its ``onednn`` backend): the official ``forward``'s samples up to float rounding
    (the decoder is causal, docs/codec_streaming.md; so past 300 frames, where the official ``decode`` switches to its
    approximate ``chunked_decode``, the exact forward's, not the official decode's), in about half its time and a
    bounded part of its memory (one call over a whole utterance holds every layer's activations for every frame).
    Elsewhere (a GPU, another codec) the codec's own ``decode`` runs. Errors: the codec's own (codes out of range:
    ValueError, one line).
    """
    dec = official_decoder(codec)
    if dec is not None and next(dec.parameters()).device.type == "cpu" and onednn_available()[0]:
        c = torch.as_tensor(codes).cpu().long()
        stream = _DECODE_STREAMS.get(dec)
        if stream is None:  # its weights laid out for oneDNN once per decoder, not per utterance
            stream = _DECODE_STREAMS[dec] = StreamingCodecDecoder(dec, 1, backend="onednn",
                                                                  chunk_frames_hint=DECODE_CHUNK_FRAMES)
        stream.reset(1)
        c = c.T[None]  # (1, 16, frames): the stream's codebook-major layout
        parts = [stream.push(c[..., i:i + DECODE_CHUNK_FRAMES]) for i in range(0, c.shape[-1], DECODE_CHUNK_FRAMES)]
        return torch.cat(parts, -1)[0].float().numpy(), stream.sample_rate
    tokenizer = codec.tokenizer if isinstance(codec, Qwen12HzCodec) else codec
    wavs, sr = tokenizer.decode([{"audio_codes": torch.as_tensor(codes)}])
    return np.asarray(wavs[0], dtype=np.float32).reshape(-1), int(sr)
