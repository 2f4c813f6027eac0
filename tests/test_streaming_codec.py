"""Streaming codec decoding (docs/codec_streaming.md): the official 12 Hz decoder streamed chunk by chunk equals its
full-sequence forward (a TINY config of the official class, random weights, both backends), any chunking gives the
same audio, chunk boundaries are not clicks, batch rows equal single rows, reset starts afresh, bad input raises one
line; and the embedded model's offline codec streams with its stated look-ahead."""

import numpy as np
import pytest
import torch

from rvqspec_lib.models.configs import build_codec_decoder, tiny_codec_decoder_config_dict
from rvqspec_lib.models.streaming_codec import StreamingCodecDecoder
from rvqspec_lib.models.streaming_layers import onednn_available

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
    8 bits of mantissa at every layer); it must be as close to the float32 forward as the official bfloat16 forward is."""
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
