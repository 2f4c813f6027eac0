"""Streaming codec decoding (docs/codec_streaming.md): the official 12 Hz decoder streamed chunk by chunk equals its
full-sequence forward (a TINY config of the official class, random weights, both backends), any chunking gives the
same audio, chunk boundaries are not clicks, batch rows equal single rows, reset starts afresh, bad input raises one
line; and the embedded model's offline codec streams with its stated look-ahead."""

import numpy as np
import pytest
import torch

from paper.notebook_measures import log_spectral_distance
from rvqspec_lib.models.configs import build_codec_decoder, tiny_codec_decoder_config_dict
from rvqspec_lib.device.streaming_codec import StreamingCodecDecoder
from rvqspec_lib.device.streaming_layers import onednn_available

FRAME = 1920
BACKENDS = ["official"] + (["onednn"] if onednn_available()[0] else [])
#: float32 streaming vs the full forward: relative RMS difference (measured about 2e-6: summation order only).
F32_REL = 2e-5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def codes_of(batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, 16, frames), generator=torch.Generator().manual_seed(seed))


def stream(dec: StreamingCodecDecoder, codes: torch.Tensor, chunks) -> torch.Tensor:
    dec.reset(codes.shape[0])
    out, i = [], 0
    for n in chunks:
        out.append(dec.push(codes[..., i:i + n]))
        i += n
    assert i == codes.shape[2]
    return torch.cat(out, -1)


@pytest.fixture(scope="module")
def decoder():
    """Tiny official decoder, attention window 6 frames (streams of 20 frames run past it)."""
    return build_codec_decoder("tiny", seed=0)


@pytest.fixture(scope="module")
def full(decoder):
    codes = codes_of(2, 20)
    with torch.no_grad():
        return codes, decoder(codes)[:, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_equals_full_forward(decoder, full, backend):
    codes, ref = full
    dec = StreamingCodecDecoder(decoder, batch_size=2, backend=backend)
    wav = stream(dec, codes, [1] * 20)
    assert wav.shape == (2, 20 * FRAME) and wav.dtype == torch.float32
    assert float(ref.std()) > 0.05  # the random decoder makes audio, not silence
    assert rel(wav, ref) < F32_REL
    assert dec.frames == 20 and dec.flush().shape == (2, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_chunking_gives_the_same_audio(decoder, full, backend):
    codes, ref = full
    dec = StreamingCodecDecoder(decoder, batch_size=2, backend=backend)
    ones = stream(dec, codes, [1] * 20)
    for chunks in ([3] * 6 + [2], [2, 1] * 6 + [2], [7, 13], [20]):
        assert rel(stream(dec, codes, chunks), ones) < F32_REL, chunks


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_clicks_at_chunk_boundaries(decoder, full, backend):
    """The sample-to-sample step across each chunk boundary equals the full decode's, and is no outlier among the
    steps inside chunks."""
    codes, ref = full
    dec = StreamingCodecDecoder(decoder, batch_size=2, backend=backend)
    chunks = [1, 2, 3, 1, 4, 2, 7]
    wav = stream(dec, codes, chunks)
    bounds = np.cumsum(chunks)[:-1] * FRAME
    step, step_ref = torch.diff(wav, dim=-1), torch.diff(ref, dim=-1)
    at = torch.as_tensor(bounds - 1)
    assert torch.allclose(step[:, at], step_ref[:, at], atol=1e-5)
    inside = torch.ones(step.shape[-1], dtype=torch.bool)
    inside[at] = False
    assert float(step[:, at].abs().max()) <= float(step[:, inside].abs().max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_rows_equal_single_rows(decoder, backend):
    codes = codes_of(3, 9, seed=1)
    batch = stream(StreamingCodecDecoder(decoder, batch_size=3, backend=backend), codes, [2, 4, 3])
    one = StreamingCodecDecoder(decoder, backend=backend)
    for r in range(3):
        assert rel(batch[r], stream(one, codes[r:r + 1], [2, 4, 3])[0]) < F32_REL


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_gives_a_fresh_stream(decoder, backend):
    codes = codes_of(1, 8, seed=2)
    dec = StreamingCodecDecoder(decoder, backend=backend)
    first = stream(dec, codes, [3, 5])
    dec.push(codes_of(1, 4, seed=3))  # more state
    dec.reset(1)
    assert dec.frames == 0
    again = torch.cat([dec.push(codes[..., :3]), dec.push(codes[..., 3:])], -1)
    assert torch.equal(first, again)


def test_backends_agree(decoder):
    if len(BACKENDS) < 2:
        pytest.skip(onednn_available()[1])
    codes = codes_of(1, 10, seed=4)
    a = stream(StreamingCodecDecoder(decoder, backend="official"), codes, [4, 6])
    b = stream(StreamingCodecDecoder(decoder, backend="onednn"), codes, [4, 6])
    assert rel(a, b) < F32_REL


def test_chunked_decode_differs_only_by_its_truncated_context():
    """The official chunked_decode keeps 25 frames of left context: it equals the stream (and forward) while a stream
    is at most 25 frames + one chunk long, and with a context as long as the stream; with the released attention
    window (72 frames) and 25 frames of context it differs after frame 26."""
    dec_mod = build_codec_decoder(tiny_codec_decoder_config_dict(sliding_window=72), seed=0)
    codes = codes_of(1, 36, seed=5)
    wav = stream(StreamingCodecDecoder(dec_mod), codes, [1] * 36)
    with torch.no_grad():
        cd25 = dec_mod.chunked_decode(codes, chunk_size=1)[:, 0]
        cd_all = dec_mod.chunked_decode(codes, chunk_size=1, left_context_size=36)[:, 0]
    head = slice(0, 26 * FRAME)
    assert rel(wav[:, head], cd25[:, head]) < F32_REL
    assert rel(wav, cd_all) < F32_REL
    assert rel(wav[:, 26 * FRAME:], cd25[:, 26 * FRAME:]) > 1e-3  # truncation shows (tiny: layer scale 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_stream_is_as_close_as_the_official_bfloat16_forward(backend):
    """In bfloat16 the stream cannot equal the bfloat16 forward bit for bit (different summation orders, rounded to
    8 bits of mantissa at every layer); it must be as close to the float32 forward as the official bfloat16 forward
    is."""
    codes = codes_of(1, 12, seed=6)
    d32, d16 = build_codec_decoder("tiny"), build_codec_decoder("tiny", dtype=torch.bfloat16)
    with torch.no_grad():
        ref32, ref16 = d32(codes)[:, 0], d16(codes)[:, 0].float()
    wav = stream(StreamingCodecDecoder(d16, backend=backend), codes, [1, 3, 8])
    assert rel(wav, ref32) < max(2 * rel(ref16, ref32), 0.05)


def test_errors_are_one_line(decoder):
    dec = StreamingCodecDecoder(decoder)
    cases = [(codes_of(1, 2)[:, :15], "16, frames"),
             (codes_of(1, 2)[..., :0], "0 frames"),
             (torch.full((1, 16, 2), 2048), "[0, 2048)"),
             (torch.full((1, 16, 2), -1), "[0, 2048)"),
             (codes_of(1, 2).float(), "integers"),
             (codes_of(2, 2), "reset(batch_size=2)"),
             (codes_of(1, 2)[0], "16, frames")]
    for codes, words in cases:
        with pytest.raises(ValueError, match=None) as e:
            dec.push(codes)
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="backend"):
        StreamingCodecDecoder(decoder, backend="cuda-graphs")
    with pytest.raises(ValueError, match="batch_size"):
        dec.reset(0)
    assert dec.frames == 0  # nothing was decoded


# ---- the embedded model's offline codec ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedded():
    """The shipped codec (with its neural code decoder) and the codes of one shipped utterance, (1, 16, 16)."""
    from safetensors import safe_open

    from rvqspec_lib.common.paths import DATA_DIR
    from rvqspec_lib.models.rvq_codec import RVQCodec

    codec = RVQCodec.load(DATA_DIR / "embedded")
    with safe_open(str(DATA_DIR / "embedded" / "utterances.safetensors"), "pt") as f:
        codes = f.get_tensor(sorted(f.keys())[300]).long()[:16].T[None]
    return codec, codes


def stream_rvq(codec, codes, chunks, **kw):
    from rvqspec_lib.device.streaming_rvq import StreamingRVQDecoder

    dec = StreamingRVQDecoder(codec, batch_size=codes.shape[0], **kw)
    out, i, emitted = [], 0, []
    for n in chunks:
        out.append(dec.push(codes[..., i:i + n]))
        i += n
        emitted.append(dec.emitted)
    out.append(dec.flush())
    return torch.cat(out, -1), emitted, dec


def test_embedded_stream_same_audio_for_any_chunking_and_batch(embedded):
    """Bit for bit: every frame's computation has the same shapes whatever the chunking or batch (Griffin-Lim is
    chaotic, so nothing less would do)."""
    codec, codes = embedded
    ones, emitted, dec = stream_rvq(codec, codes, [1] * 16)
    assert dec.lookahead_frames == 3 and dec.first_audio_frames == 2 and emitted == ramp_emitted(16)
    assert ones.shape == (1, 16 * FRAME) and ones.dtype == torch.float32
    for chunks in ([3] * 5 + [1], [2, 1] * 5 + [1], [16], [7, 9]):
        assert torch.equal(stream_rvq(codec, codes, chunks)[0], ones), chunks
    two = torch.cat([codes, codes.flip(-1)])
    batch = stream_rvq(codec, two, [5, 11])[0]
    assert torch.equal(batch[0], ones[0])
    assert torch.equal(batch[1], stream_rvq(codec, two[1:], [16])[0][0])


def ramp_emitted(n: int, ramp: int = 4) -> list[int]:
    """Frames out after each of n one-frame pushes: frame t needs frame t + 1's vector (phase), whose code window
    reaches min(2, (t + 1) // ramp) frames past it."""
    la = (lambda s: min(2, s // ramp)) if ramp else (lambda s: 2)
    return [max(0, sum(s + la(s) < k for s in range(k)) - 1) for k in range(1, n + 1)]


def test_embedded_stream_ramp_keeps_ahead_of_the_player(embedded):
    """The start-up ramp: the first audio after 2 pushed frames, not 4; the full look-ahead from frame 8 on, so a
    generator at 60 ms per 80 ms frame never leaves the player waiting, and one at 70 ms does (negative control);
    ``ramp_frames=0`` is the constant look-ahead, which tolerates up to 80 ms."""
    from rvqspec_lib.models.streaming import playback

    codec, codes = embedded
    flat, emitted, dec = stream_rvq(codec, codes, [1] * 16, ramp_frames=0)
    assert dec.first_audio_frames == 4 and emitted == [max(0, k - 3) for k in range(1, 17)] == ramp_emitted(16, 0)

    def underruns(emitted, frame_ms):
        ready = [k * frame_ms for k, (a, b) in enumerate(zip([0] + emitted, emitted), 1) for _ in range(b - a)]
        return sum(late > 1e-9 for _, late in playback([r / 1e3 for r in ready], [0.08] * len(ready)))

    ramp = ramp_emitted(400)
    assert underruns(ramp, 60.0) == 0 and underruns(ramp, 70.0) > 0
    assert underruns(ramp_emitted(400, 0), 80.0) == 0 and underruns(ramp_emitted(400, 0), 81.0) > 0
    with pytest.raises(ValueError, match="ramp_frames"):
        stream_rvq(codec, codes, [1], ramp_frames=-1)


def test_embedded_stream_close_to_the_offline_decode(embedded):
    """The streamed audio's spectrum is about as close to the decoded frame vectors as the offline decode's
    (measured on shipped utterances: 1.68 dB against 1.32 dB offline; docs/codec_streaming.md)."""
    codec, codes = embedded
    wav = stream_rvq(codec, codes, [4] * 4)[0][0].numpy()
    frames = codes[0].T.numpy()
    target = codec.decode_vectors(frames)
    offline = log_spectral_distance(codec, codec.features(codec.decode(frames)), target)
    assert log_spectral_distance(codec, codec.features(wav), target) < offline + 1.0


def test_embedded_stream_no_clicks(embedded):
    """Frame boundaries (chunk boundaries among them) are no clicks: pooled over six shipped utterances, the mean
    sample-to-sample step at a boundary is under twice the mean inside frames (it measured 1.1-2.8 times per
    utterance, with or without the start-up ramp), and no boundary step exceeds 1.5 times its utterance's 99.9th
    percentile inside."""
    from safetensors import safe_open

    from rvqspec_lib.common.paths import DATA_DIR

    codec, _ = embedded
    with safe_open(str(DATA_DIR / "embedded" / "utterances.safetensors"), "pt") as f:
        keys = sorted(f.keys())[300::40][:6]
        utterances = [f.get_tensor(k).long()[:16].T[None] for k in keys]
    at_steps, inside_steps = [], []
    for codes in utterances:
        wav = stream_rvq(codec, codes, [1, 2, 3, 4, 6])[0][0]
        step = torch.diff(wav).abs()
        at = torch.arange(1, 16) * FRAME - 1  # every frame boundary (chunk boundaries among them)
        inside = torch.ones_like(step, dtype=torch.bool)
        inside[at] = False
        assert float(step[at].max()) <= 1.5 * float(step[inside].quantile(0.999))
        at_steps.append(step[at]), inside_steps.append(step[inside])
    assert float(torch.cat(at_steps).mean()) <= 2.0 * float(torch.cat(inside_steps).mean())


def test_embedded_table_decoder_streams_with_one_frame_of_lookahead(embedded):
    codec, codes = embedded
    wav, emitted, dec = stream_rvq(codec.with_decoder(None), codes[..., :6], [2, 2, 2])
    assert dec.lookahead_frames == 1 and emitted == [1, 3, 5] and wav.shape == (1, 6 * FRAME)


def test_embedded_stream_errors(embedded):
    from rvqspec_lib.device.streaming_rvq import StreamingRVQDecoder

    codec, codes = embedded
    dec = StreamingRVQDecoder(codec)
    for bad, words in ((codes[:, :8], "16, frames"), (codes[..., :0], "0 frames"), (codes + 4096, "[0, 2048)")):
        with pytest.raises(ValueError) as e:
            dec.push(bad)
        assert words in str(e.value) and "\n" not in str(e.value)
    dec.push(codes[..., :2])
    dec.flush()
    with pytest.raises(ValueError, match="reset"):
        dec.push(codes[..., 2:4])
    with pytest.raises(ValueError, match="gl_lookahead_frames"):
        StreamingRVQDecoder(codec, gl_lookahead_frames=0)
    with pytest.raises(ValueError, match="StreamingCodecDecoder"):
        StreamingRVQDecoder(object())


def test_streaming_decoder_picks_the_class(embedded, decoder):
    from rvqspec_lib.models.speech_tokenizers import CodecSpeechTokenizer
    from rvqspec_lib.models.speech_tokenizers import streaming_decoder
    from rvqspec_lib.device.streaming_rvq import StreamingRVQDecoder

    codec, _ = embedded
    assert isinstance(streaming_decoder(codec), StreamingRVQDecoder)
    assert isinstance(streaming_decoder(CodecSpeechTokenizer(codec)), StreamingRVQDecoder)
    assert isinstance(streaming_decoder(decoder), StreamingCodecDecoder)
    with pytest.raises(ValueError, match="no streaming decoder"):
        streaming_decoder(torch.nn.Linear(2, 2))
