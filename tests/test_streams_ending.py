"""Concurrent streams that end at different times (docs/streaming.md#batches): a row that ends before the longest
is flushed where it ends, as a stream of that row alone is, so its audio equals its single run bit for bit (the
embedded model's look-ahead codec) and is silence after; ``AudioStream.collect`` gives each row's own audio. The
negative control: the codec fed code 0 after a row's end (the way ended rows were decoded before) moves its last
look-ahead frames."""

from __future__ import annotations

import pytest
import torch

from rvqspec_lib.decoding.decoders import AR
from rvqspec_lib.decoding.sampling import Sampling
from rvqspec_lib.device.native_talker import NativeTalker
from rvqspec_lib.device.streaming_codec import StreamingCodecDecoder
from rvqspec_lib.models.backends import available, frame_runner
from rvqspec_lib.models.configs import build_codec_decoder
from rvqspec_lib.models.frame import inner_sampling
from rvqspec_lib.models.loader import load_model
from rvqspec_lib.models.streaming import codec_stream_for, synthesize_stream

FRAME = 1920
LENGTHS = (5, 11, 8)  # frames each row speaks; the batch runs 11


@pytest.fixture(scope="module")
def embedded():
    return load_model("embedded")


def _codes(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (len(lengths), 16, max(lengths)), generator=g)


def _alone(dec, codes_row):
    dec.reset(1)
    return torch.cat([dec.push(codes_row[None]), dec.flush()], -1)[0]


@pytest.mark.parametrize("chunk", [1, 3, 11])
def test_a_row_that_ends_first_is_its_own_stream_bit_for_bit(embedded, chunk):
    dec = codec_stream_for(embedded, batch_size=len(LENGTHS))
    assert dec.lookahead_frames == 3
    codes = _codes(LENGTHS)
    active = torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None]  # (B, frames)
    dec.reset(len(LENGTHS))
    parts = [dec.push(codes[:, :, i:i + chunk], active[:, i:i + chunk]) for i in range(0, max(LENGTHS), chunk)]
    wav = torch.cat(parts + [dec.flush()], -1)
    assert wav.shape == (len(LENGTHS), max(LENGTHS) * FRAME)
    solo = codec_stream_for(embedded)
    for r, n in enumerate(LENGTHS):
        alone = _alone(solo, codes[r, :, :n])
        assert alone.shape == (n * FRAME,) and float(alone.abs().max()) > 0
        assert torch.equal(wav[r, :n * FRAME], alone), (r, chunk)
        assert not wav[r, n * FRAME:].any()  # silence after its end
    # negative control: code 0 fed after the end, no end given (the old way), changes the ended rows' last frames
    dec.reset(len(LENGTHS))
    zeros = torch.where(active[:, None, :], codes, torch.zeros_like(codes))
    old = torch.cat([dec.push(zeros), dec.flush()], -1)
    for r, n in enumerate(LENGTHS):
        same = torch.equal(old[r, :n * FRAME], wav[r, :n * FRAME])
        assert same == (n == max(LENGTHS)), r
        assert torch.equal(old[r, :(n - dec.lookahead_frames) * FRAME], wav[r, :(n - dec.lookahead_frames) * FRAME])


def test_active_is_checked(embedded):
    dec = codec_stream_for(embedded, batch_size=2)
    codes = _codes((4, 4))
    with pytest.raises(ValueError, match="once a row has ended"):
        dec.push(codes, torch.tensor([[True, False, True, True], [True] * 4]))
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        dec.push(codes, torch.ones(2, 3, dtype=torch.bool))
    dec.reset(2)
    dec.push(codes[:, :, :2], torch.tensor([[True, False], [True, True]]))
    with pytest.raises(ValueError, match="row 0 ended in an earlier push"):
        dec.push(codes[:, :, 2:], torch.ones(2, 2, dtype=torch.bool))


def test_the_causal_official_decoder_silences_a_row_after_its_end():
    dec = StreamingCodecDecoder(build_codec_decoder("tiny", seed=0), 2)
    codes = _codes((6, 6), seed=1)
    active = torch.tensor([[True] * 3 + [False] * 3, [True] * 6])
    wav = dec.push(codes, active)
    dec.reset(2)
    free = dec.push(codes)
    assert torch.equal(wav[:, :3 * FRAME], free[:, :3 * FRAME]) and torch.equal(wav[1], free[1])
    assert not wav[0, 3 * FRAME:].any() and free[0, 3 * FRAME:].any()


@pytest.mark.skipif(not available("native")[0], reason="the native forward does not build here")
def test_streams_of_different_lengths_each_equal_their_single_run(embedded):
    """Greedy, through the library: each row's audio (collect) equals the same text streamed alone, bit for bit,
    rows that end first included; the codes too."""
    lm = embedded
    greedy = Sampling.from_generation_config(lm.generation or {}, loop="talker", greedy=True)
    texts = ["Yes.", "The weather is fine today.", "Hello there."]

    def stream(text):
        runner = frame_runner("native", lm.code_predictor, AR(), fused=True, sampling=inner_sampling(lm, greedy=True))
        return synthesize_stream(lm, text, runner=runner, talker=NativeTalker(lm), talker_sampling=greedy,
                                 chunk_frames=2, max_frames=60)

    batch = stream(texts)
    rows = batch.collect()
    frames = [int(batch.codes(r).shape[0]) for r in range(len(texts))]
    assert min(frames) < max(frames) < 60  # every row ended by itself, some before the longest
    for r, text in enumerate(texts):
        alone = stream(text)
        solo = torch.cat([c.audio for c in alone], -1)
        assert torch.equal(batch.codes(r), alone.codes())
        assert rows[r].shape == (frames[r] * FRAME,) and torch.equal(rows[r], solo), text
